"""`gpuwire inventory` (also `kubectl gpuwire inventory`): which pod holds which GPU, on every
node, from the node annotations the gpuwire agents keep and the pods the API server lists.

`view.build(nodes, pods)` turns API objects into an `Inventory`; `table.render` prints it.
"""
