#!/bin/sh
# gpuwire-runtime, the launcher containerd calls (runtime_hook/setup/launcher.py): Python
# only for a create that may ask for a GPU or the delete of a container with a record, the
# configured runtime exec'd directly for everything else. It parses the arguments and reads
# the config as runtime_hook.start.shim and runtime_hook.start.config do (tests hold it to it).
# Written by the install (runtime_hook/setup/launcher.py): the Python that runs the shim and
# what it runs; gpuwire-call, the resident's socket and this build's token where gpuwire-call
# was built (call empty: Python only).
python=python3 code='' call='' socket='' token=''
shim() {
	if [ -n "$call" ]; then
		exec "$call" "$socket" "$token" runtime $(($# + 1)) "$python" -IS -c "$code" "$0" "$@"
	fi
	exec "$python" -IS -c "$code" "$0" "$@"
}
# exec $1 with the other arguments if it is the runtime's first executable candidate
run() {
	path=$1
	shift
	if [ -x "$path" ] && [ ! -d "$path" ]; then
		case ${path##*/} in gpuwire-runtime) shim "$@" ;; esac
		# shellcheck disable=SC3013 # -ef: dash and bash (Debian's and RHEL's sh) have it
		case $0 in */*) if [ "$path" -ef "$0" ]; then shim "$@"; fi ;; esac
		exec "$path" "$@"
	fi
}

create='' bundle='' found='' wanted='' previous='' deleting='' last=''
for arg do
	if [ -n "$wanted" ]; then bundle=$arg wanted=; fi
	case $previous in --bundle | -bundle | -b) ;; *)
		case $arg in create | run) create=1 ;; esac ;;
	esac
	case $arg in delete) deleting=1 ;; esac
	if [ -z "$found" ]; then
		case $arg in
		--bundle=* | -bundle=* | -b=*) found=1 bundle=${arg#*=} ;;
		--bundle | -bundle | -b) found=1 wanted=1 ;;
		esac
	fi
	previous=$arg last=$arg
done
if [ -n "$create" ]; then
	grep -qsE -e 'NVIDIA_VISIBLE_DEVICES|AMD_VISIBLE_DEVICES|CUDA_VERSION|/run/gpuwire/allocations/|\\/|\\u00(2[Ff]|[4-7][0-9A-Fa-f])' -- "${bundle:-.}/config.json"
	[ $? -eq 1 ] || shim "$@"
fi

config=${GPUWIRE_CONFIG:-/etc/gpuwire/config.toml}
runtime=runc records=/run/gpuwire/containers odd=
if [ -f "$config" ] && [ -r "$config" ]; then
	seen=' '
	while IFS= read -r line || [ -n "$line" ]; do
		case $line in
		'' | '#'*) continue ;;
		*[!\ -~]* | *\\*) odd=1 ;;
		[a-z]*' = "'*'"') ;;
		*) odd=1 ;;
		esac
		key=${line%%' = "'*} value=${line#*' = "'}
		value=${value%'"'}
		case $value in *'"'*) odd=1 ;; esac
		case $seen in *" $key "*) odd=1 ;; esac
		seen="$seen$key "
		case $key in
		root) case $value in /*) : ;; *) odd=1 ;; esac ;;
		driver-root) case $value in /*) : ;; *) odd=1 ;; esac ;;
		dev-root) case $value in /*) : ;; *) odd=1 ;; esac ;;
		proc-root) case $value in /*) : ;; *) odd=1 ;; esac ;;
		sys-root) case $value in /*) : ;; *) odd=1 ;; esac ;;
		vendor) case $value in nvidia | amd) : ;; *) odd=1 ;; esac ;;
		trust) case $value in granted | any) : ;; *) odd=1 ;; esac ;;
		grant-key-dir) case $value in /*) : ;; *) odd=1 ;; esac ;;
		allocation-dir) case $value in /*) : ;; *) odd=1 ;; esac ;;
		runtime) case $value in ?*) runtime=$value ;; *) odd=1 ;; esac ;;
		ldconfig) case $value in /*) : ;; *) odd=1 ;; esac ;;
		hook) case $value in /*) : ;; *) odd=1 ;; esac ;;
		log) case $value in stderr | /*) : ;; *) odd=1 ;; esac ;;
		records-dir) case $value in /*) records=$value ;; *) odd=1 ;; esac ;;
		mig-map) case $value in /*) : ;; *) odd=1 ;; esac ;;
		mps-root) case $value in /*) : ;; *) odd=1 ;; esac ;;
		hami-library) case $value in /*) : ;; *) odd=1 ;; esac ;;
		hami-dir) case $value in /*) : ;; *) odd=1 ;; esac ;;
		driver-facts) case $value in /*) : ;; *) odd=1 ;; esac ;;
		amd-cards) case $value in true | false) : ;; *) odd=1 ;; esac ;;
		*) odd=1 ;;
		esac
		[ -z "$odd" ] || break
	done <"$config"
elif [ -e "$config" ] || [ -n "${GPUWIRE_CONFIG-}" ]; then
	odd=1
fi
[ -z "$odd" ] || shim "$@"
if [ -n "$deleting" ]; then
	case $last in '' | .* | *[!A-Za-z0-9_+.-]*) shim "$@" ;; esac
	[ "${#last}" -le 250 ] || shim "$@"
	if [ -e "$records/$last" ] || [ -L "$records/$last" ]; then shim "$@"; fi
fi

case $runtime in
*/*) run "$runtime" "$@" ;;
*)
	set -f
	IFS=:
	for dir in $PATH; do
		[ -z "$dir" ] || run "$dir/$runtime" "$@"
	done
	;;
esac
shim "$@"

