#!/bin/sh
# gpuwire-hook, the launcher of gpuwire's OCI hooks (runtime_hook/setup/launcher.py): Python at
# once, through the resident gpuwire where gpuwire-call was built; the resident alone where
# the install has no Python here.
# Written by the install: as in gpuwire-runtime.sh.
python=python3 code='' call='' socket='' token=''
if [ -z "$python" ]; then # no Python here: the resident, waited for (gpuwire-call)
	exec "$call" "$socket" "$token" hook $(($# + 1)) "$0" "$@"
fi
if [ -n "$call" ]; then
	exec "$call" "$socket" "$token" hook $(($# + 1)) "$python" -IS -c "$code" "$0" "$@"
fi
exec "$python" -IS -c "$code" "$0" "$@"
