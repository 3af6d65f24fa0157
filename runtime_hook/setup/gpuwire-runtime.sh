#!/bin/sh
# gpuwire-runtime, the launcher containerd calls (runtime_hook/setup/launcher.py): Python
# only for a create that may ask for a GPU or the delete of a container with a record, the
# configured runtime exec'd directly for everything else. It parses the arguments and reads
# the config as runtime_hook.start.shim and runtime_hook.start.config do (tests hold it to it).
# Written by the install (runtime_hook/setup/launcher.py): the Python that runs the shim and
# what it runs; gpuwire-call, the resident's socket and this build's token where gpuwire-call
# was built (call empty: Python only; python empty: the resident only, no Python here).
python=python3 code='' call='' socket='' token=''
shim() {
	if [ -z "$python" ]; then
		# A create that may ask for a GPU waits for the resident (gpuwire-call without a
		# fallback); anything else runs the runtime where no resident answers: a GPU
		# container's delete (its record is swept later, records.sweep), a call under a
		# config this script leaves to Python.
		if [ -z "$asks" ] && find_runtime; then
			# shellcheck disable=SC2016 # expanded by that shell: $0 the runtime, $1 ours
			exec "$call" "$socket" "$token" runtime $(($# + 1)) \
				/bin/sh -c 'shift; exec "$0" "$@"' "$executable" "$0" "$@"
		fi
		exec "$call" "$socket" "$token" runtime $(($# + 1)) "$0" "$@"
	fi
	if [ -n "$call" ]; then
		exec "$call" "$socket" "$token" runtime $(($# + 1)) "$python" -IS -c "$code" "$0" "$@"
	fi
	exec "$python" -IS -c "$code" "$0" "$@"
}
# The runtime's first executable candidate (the configured path, or the name on PATH) into
# $executable; status 1 where there is none, or it is this launcher (the shim says why not).
find_runtime() {
	executable=
	case $runtime in
	*/*) set -- "$runtime" ;;
	*)
		set -f
		IFS=:
		# shellcheck disable=SC2086 # PATH split at its colons (the script execs next)
		set -- $PATH
		;;
	esac
	for path do
		case $runtime in */*) ;; *)
			[ -n "$path" ] || continue
			path=$path/$runtime
			;;
		esac
		if [ -x "$path" ] && [ ! -d "$path" ]; then
			case ${path##*/} in gpuwire-runtime) return 1 ;; esac
			# shellcheck disable=SC3013 # -ef: dash and bash (Debian's and RHEL's sh) have it
			case $0 in */*) if [ "$path" -ef "$0" ]; then return 1; fi ;; esac
			executable=$path
			return 0
		fi
	done
	return 1
}

create='' asks='' bundle='' found='' wanted='' previous='' deleting='' last=''
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
	[ $? -eq 1 ] || { asks=1; shim "$@"; }
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

if find_runtime; then
	exec "$executable" "$@"
fi
shim "$@"
