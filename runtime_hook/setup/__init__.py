"""Setting a node up for gpuwire: what an admin or the node installer runs, never a start.

`gpuwire containerd configure` (`containerd_config`), `gpuwire cdi generate` (on
`gpuwire.cdi`), `gpuwire grant verify`, all in `cli`; and the launchers containerd calls
(`launcher`, with the shell programs beside it and `call.c`, gpuwire-call).
"""
