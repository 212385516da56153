#!/usr/bin/env bash
# A course hub for gpclab on one Debian 12 machine: JupyterHub (PAM log-in, one Unix user per
# person), the lectures, nbgrader's exchange and the instructor's course. Run as root from a
# clone of the repository; the README's "A course hub (JupyterHub): one command" says what each
# step does.
#
#   exercises/hub/setup.sh install --instructor NAME [--port 8000] [--hub-port 8081]
#                                  [--proxy-api-port 8001] [--no-restart]   set up (or check), start
#   exercises/hub/setup.sh add-student NAME [NAME...]               Unix users in the course
#   exercises/hub/setup.sh add-student --from FILE.csv [--passwords OUT.csv]   (OUT: mode 600)
#   exercises/hub/setup.sh start | stop | status                    the hub
#   exercises/hub/setup.sh archive [--to DIR]        gradebook, grades, course, exchange: a
#                                                    root-only tarball (end of term)
#   exercises/hub/setup.sh uninstall [--keep-venv] [--remove-users [--remove-instructor]]
#                                    [--no-archive]   archives first, then removes the hub, its
#                                    files and folders (users: only those it created)
#
# Ports: 8000 (users, 127.0.0.1; put a TLS reverse proxy in front), 8081 (the hub's API) and
# 8001 (the proxy's API), both 127.0.0.1 only. Running `install` again changes nothing that is
# already as it should be (it only reports); it restarts the hub (stopping every user's running
# server) only when the hub's own configuration changed, and never with --no-restart.
# Locations can be moved with environment variables (defaults in brackets):
#   GPCLAB_COURSE_PREFIX [/opt/gpclab-course]  the venv, configurable-http-proxy, the hub's state
#   GPCLAB_EXCHANGE      [/srv/nbgrader/exchange]  nbgrader's exchange root
#   GPCLAB_ARCHIVE_DIR   [/var/backups/gpclab-course]  where archive (and uninstall) put tarballs
set -euo pipefail
umask 022
# the caller's Python settings must not reach the venv, the compile step or the hub (whose
# spawner would pass PYTHONPATH on to every user's server)
unset PYTHONPATH PYTHONHOME PYTHONSTARTUP PYTHONUSERBASE PYTHONNOUSERSITE VIRTUAL_ENV

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CLONE=$(cd "$HERE/../.." && pwd)
PREFIX=${GPCLAB_COURSE_PREFIX:-/opt/gpclab-course}
VENV=$PREFIX/venv
SETTINGS=$PREFIX/etc/course.env
STATE=$PREFIX/state
LOG=$PREFIX/log/jupyterhub.log
PIDFILE=$STATE/jupyterhub.pid
COURSE_ID=gpclab
STUDENTS_GROUP=gpclab-students
INSTRUCTORS_GROUP=gpclab-instructors
JUPYTERHUB_REQ="jupyterhub>=5.2,<7"
CHP_REQ="configurable-http-proxy@^5"
PROFILE_D=/etc/profile.d/gpclab-course.sh
SUDOERS=/etc/sudoers.d/gpclab-course
NBGRADER_GLOBAL=/etc/jupyter/nbgrader_config.py

say() { printf '%s\n' "gpclab-hub: $*"; }
die() { printf '%s\n' "gpclab-hub: error: $*" >&2; exit 1; }

need_root() { [ "$(id -u)" = 0 ] || die "run as root (it creates users, /etc files and the hub)"; }

# ---- small idempotent helpers -----------------------------------------------------------------
# the files this recipe wrote, with the hash of what it wrote ("HASH  PATH" lines, root only): a
# file outside the prefix found different from what the recipe last wrote (or that it never
# wrote) is kept as PATH.before-gpclab-<time> before being replaced
WRITTEN=$STATE/written-files
written_hash() { [ -f "$WRITTEN" ] && awk -v p="$1" 'substr($0, 67) == p { h = $1 } END { if (h) print h }' "$WRITTEN"; }
record_written() {
    local h; h=$(sha256sum < "$1" | cut -c1-64)
    [ -d "$(dirname "$WRITTEN")" ] || return 0
    { [ -f "$WRITTEN" ] && awk -v p="$1" 'substr($0, 67) != p' "$WRITTEN"; echo "$h  $1"; } > "$WRITTEN.new"
    chmod 600 "$WRITTEN.new"; mv -f "$WRITTEN.new" "$WRITTEN"
}
# install_file SRC DEST MODE OWNER: copy only if the content, mode or owner differ; sets CHANGED
CHANGED=0
ARCHIVED=""
HUB_CHANGED=0   # the hub's own configuration or software changed: a restart is needed
# hub_tracked CMD...: run CMD; if it changed anything, the hub needs a restart
hub_tracked() {
    local c0=$CHANGED; CHANGED=0
    "$@"
    if [ "$CHANGED" = 1 ]; then HUB_CHANGED=1; fi
    if [ "$c0" = 1 ]; then CHANGED=1; fi
}
install_file() {
    local src=$1 dest=$2 mode=$3 owner=$4
    if [ -f "$dest" ] && cmp -s "$src" "$dest" \
        && [ "$(stat -c '%a %U:%G' "$dest")" = "$mode $owner" ]; then
        [ -n "$(written_hash "$dest")" ] || record_written "$dest"
        return 0
    fi
    if [ -L "$dest" ]; then die "$dest is a symbolic link; expected a file"; fi
    # (inside the recipe's own prefix nothing is kept: it is all the recipe's)
    if [ -f "$dest" ] && [ "${dest#"$PREFIX"/}" = "$dest" ] && ! cmp -s "$src" "$dest" \
        && [ "$(sha256sum < "$dest" | cut -c1-64)" != "$(written_hash "$dest")" ]; then
        local keep; keep="$dest.before-gpclab-$(date -u +%Y%m%dT%H%M%SZ)"
        cp -p "$dest" "$keep"
        say "kept $dest as $keep (it was not written by this recipe, or was changed since)"
    fi
    install -D -m "$mode" -o "${owner%%:*}" -g "${owner##*:}" "$src" "$dest"
    record_written "$dest"
    say "wrote $dest"
    CHANGED=1
}
# install_text DEST MODE OWNER <<< text
install_text() {
    local tmp; tmp=$(mktemp)
    cat > "$tmp"
    install_file "$tmp" "$1" "$2" "$3"
    rm -f "$tmp"
}
# ensure_dir PATH MODE OWNER: create, or correct mode and owner (only folders the recipe owns:
# never a folder's parent, never a system folder)
ensure_dir() {
    local path=$1 mode=$2 owner=$3
    if [ -L "$path" ]; then die "$path is a symbolic link; expected a folder"; fi
    refuse_system_dir "$path"
    if [ ! -d "$path" ]; then
        ensure_parent "$path"
        mkdir "$path"
        say "created $path"
    fi
    if [ "$(stat -c '%a %U:%G' "$path")" != "$mode $owner" ]; then
        chown "$owner" "$path"
        chmod "$mode" "$path"
        say "set $path to $mode $owner"
    fi
}
# ensure_parent PATH: PATH's missing parents made (root's, 755); existing ones left as they are
ensure_parent() {
    local parent; parent=$(dirname "$1")
    if [ ! -d "$parent" ]; then
        mkdir -p -m 755 "$parent"
        say "created $parent"
    fi
}
# folders the recipe must never own, change or remove (its prefix or exchange set to one of them
# by mistake): / and the system's top folders, and every user's home
SYSTEM_DIRS="/ /bin /boot /dev /etc /home /lib /lib32 /lib64 /libx32 /media /mnt /opt /proc /root
/run /sbin /srv /sys /tmp /usr /usr/bin /usr/lib /usr/local /usr/local/bin /usr/local/lib
/usr/local/share /usr/sbin /usr/share /usr/src /var /var/backups /var/cache /var/lib /var/local
/var/log /var/opt /var/spool /var/tmp /var/mail"
is_system_dir() {
    local p; p=$(realpath -m -- "$1")
    local d
    for d in $SYSTEM_DIRS; do [ "$p" = "$d" ] && return 0; done
    getent passwd | cut -d: -f6 | grep -xF -- "$p" >/dev/null && return 0   # (no -q: a pipe closed early fails under pipefail)
    return 1
}
refuse_system_dir() {
    if is_system_dir "$1"; then die "$1 is a system folder (or a home): the recipe will not own, change or remove it; choose a folder of its own, e.g. /opt/gpclab-course"; fi
}
PREFIX_MARK=.gpclab-course-prefix
# the prefix's course.env as this recipe writes it (an installation made before the marker)
recipe_settings() { [ -f "$SETTINGS" ] && head -n 1 "$SETTINGS" | grep -qx '# written by exercises/hub/setup.sh install'; }
EXCHANGE_MARK=.gpclab-course-exchange
# remove_marked DIR MARK: rm -rf DIR only if it is the recipe's own (holds MARK) and no system folder
remove_marked() {
    local dir=$1 mark=$2
    [ -e "$dir" ] || return 0
    if is_system_dir "$dir"; then say "not removing $dir: a system folder"; return 1; fi
    if [ -L "$dir" ] || [ ! -f "$dir/$mark" ]; then
        say "not removing $dir: it has no $mark, so this recipe did not make it"; return 1
    fi
    rm -rf -- "$dir"
    say "removed $dir"
}
ensure_group() {
    getent group "$1" >/dev/null || { groupadd "$1"; say "created group $1"; }
}
# user names: what useradd accepts on Debian, less what JupyterHub would change (it lower-cases
# names) or could not serve: lower-case letters, digits, _ . -, not starting with a digit, a dot
# or a dash (a numeric student id becomes e.g. s2301234), at most 32 characters
valid_user_name() { [[ $1 =~ ^[a-z_][a-z0-9_.-]{0,31}$ ]]; }
# the users this recipe created (one per line), the only ones uninstall --remove-users removes
CREATED_USERS=$STATE/created-users
# ensure_user NAME GROUP: a Unix user with a private home (0700), in GROUP; a new user gets a
# random password, in NEW_PASSWORD (empty when the user existed)
ensure_user() {
    local name=$1 group=$2
    NEW_PASSWORD=""
    valid_user_name "$name" || die "'$name' is not a valid user name (lower-case letters, digits, _ . and -, starting with a letter or _, at most 32; prefix a numeric student id with a letter: s2301234)"
    if ! id "$name" >/dev/null 2>&1; then
        useradd --create-home --shell /bin/bash -K HOME_MODE=0700 "$name"
        echo "$name" >> "$CREATED_USERS"
        NEW_PASSWORD=$(head -c 12 /dev/urandom | base64 | tr -d '/+=')
        echo "$name:$NEW_PASSWORD" | chpasswd
    fi
    id -nG "$name" | tr ' ' '\n' | grep -qx "$group" || { usermod -a -G "$group" "$name"; say "added $name to $group"; }
    local home; home=$(getent passwd "$name" | cut -d: -f6)
    [ -d "$home" ] || die "$name's home $home does not exist"
    if [ "$(stat -c '%a' "$home")" != 700 ]; then chmod 700 "$home"; say "made $home private (700)"; fi
}
say_password() {
    [ -z "$NEW_PASSWORD" ] || say "created user $1 with password: $NEW_PASSWORD   (change it with: passwd $1)"
}

# remove_refused_script PYTHON MODULE INBOUND: the root-run wrapper that sudo lets instructors
# run. It takes exactly one assignment name and nothing else (no option reaches the Python
# script, whose inbound folder is fixed here), so it can remove nothing outside INBOUND.
remove_refused_script() {
    cat <<END
#!/bin/sh
# remove the submissions of one assignment in the exchange's inbound that collect refuses
# (see gpclab_checked_exchange); usage: sudo \$0 ASSIGNMENT
if [ \$# -ne 1 ]; then echo "usage: remove-refused ASSIGNMENT (one assignment name, no options)" >&2; exit 2; fi
case \$1 in
    ''|.*|-*|*[!A-Za-z0-9_.-]*) echo "remove-refused: not an assignment name: '\$1' (letters, digits, _ . -)" >&2; exit 2;;
esac
exec "$1" -I "$2" --inbound "$3" -- "\$1"
END
}

load_settings() {
    INSTRUCTOR=""; PORT=8000; HUB_PORT=8081; PROXY_API_PORT=8001; EXCHANGE=${GPCLAB_EXCHANGE:-/srv/nbgrader/exchange}
    # shellcheck disable=SC1090
    if [ -f "$SETTINGS" ]; then . "$SETTINGS"; fi
}

hub_pid() {
    [ -f "$PIDFILE" ] || return 1
    local pid; pid=$(cat "$PIDFILE")
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && grep -q jupyterhub "/proc/$pid/cmdline" 2>/dev/null \
        && echo "$pid"
}
hub_up() { curl -fsS -o /dev/null "http://127.0.0.1:$PORT/hub/api/" 2>/dev/null; }

# ---- install -----------------------------------------------------------------------------------
cmd_install() {
    need_root
    load_settings
    NO_RESTART=0
    while [ $# -gt 0 ]; do
        case $1 in
            --instructor) INSTRUCTOR=$2; shift 2;;
            --port) PORT=$2; shift 2;;
            --hub-port) HUB_PORT=$2; shift 2;;
            --proxy-api-port) PROXY_API_PORT=$2; shift 2;;
            --no-restart) NO_RESTART=1; shift;;
            *) die "install: unknown argument '$1'";;
        esac
    done
    [ -n "$INSTRUCTOR" ] || die "install: name the instructor: setup.sh install --instructor NAME"
    valid_user_name "$INSTRUCTOR" || die "install: '$INSTRUCTOR' is not a valid user name"
    local port
    for port in "$PORT" "$HUB_PORT" "$PROXY_API_PORT"; do
        [[ $port =~ ^[0-9]{1,5}$ ]] && [ "$port" -ge 1 ] && [ "$port" -le 65535 ] \
            || die "install: '$port' is not a port number (1-65535)"
    done
    [ "$PORT" != "$HUB_PORT" ] && [ "$PORT" != "$PROXY_API_PORT" ] && [ "$HUB_PORT" != "$PROXY_API_PORT" ] \
        || die "install: --port, --hub-port and --proxy-api-port must differ ($PORT, $HUB_PORT, $PROXY_API_PORT)"
    [ -f "$CLONE/gpclab.py" ] && [ -d "$CLONE/exercises/source" ] || die "run setup.sh from a clone of gpclab ($CLONE has no gpclab.py or exercises/source)"

    # 1. Debian packages: venv, node + npm (configurable-http-proxy), bubblewrap (the grading
    #    sandbox), sudo (removing refused submissions), curl (health checks)
    local missing=()
    dpkg -s python3-venv >/dev/null 2>&1 || missing+=(python3-venv)
    command -v npm >/dev/null || missing+=(nodejs npm)
    command -v bwrap >/dev/null || missing+=(bubblewrap)
    command -v sudo >/dev/null || missing+=(sudo)
    command -v curl >/dev/null || missing+=(curl)
    if [ ${#missing[@]} -gt 0 ]; then
        say "installing ${missing[*]} (apt-get)"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi

    # 2. the course prefix: world-readable software, root-only hub state. A folder of its own:
    #    never a system folder; an existing one only if this recipe made it (its marker file)
    refuse_system_dir "$PREFIX"
    refuse_system_dir "$EXCHANGE"
    if [ -d "$PREFIX" ] && [ ! -f "$PREFIX/$PREFIX_MARK" ] && ! recipe_settings \
        && [ -n "$(ls -A "$PREFIX")" ]; then
        die "$PREFIX exists, is not empty and was not made by this recipe (no $PREFIX_MARK): choose another GPCLAB_COURSE_PREFIX"
    fi
    ensure_dir "$PREFIX" 755 root:root
    [ -f "$PREFIX/$PREFIX_MARK" ] || echo "gpclab course hub prefix (exercises/hub/setup.sh); uninstall removes this folder" > "$PREFIX/$PREFIX_MARK"
    ensure_dir "$PREFIX/etc" 755 root:root
    ensure_dir "$PREFIX/bin" 755 root:root
    ensure_dir "$PREFIX/lib" 755 root:root
    ensure_dir "$STATE" 700 root:root
    ensure_dir "$PREFIX/log" 700 root:root

    # 3. groups and the instructor
    ensure_group "$STUDENTS_GROUP"
    ensure_group "$INSTRUCTORS_GROUP"
    ensure_user "$INSTRUCTOR" "$INSTRUCTORS_GROUP"; say_password "$INSTRUCTOR"
    local ihome; ihome=$(getent passwd "$INSTRUCTOR" | cut -d: -f6)
    local igroup; igroup=$(id -gn "$INSTRUCTOR")

    hub_tracked install_text "$SETTINGS" 644 root:root <<END
# written by exercises/hub/setup.sh install
INSTRUCTOR=$INSTRUCTOR
PORT=$PORT
HUB_PORT=$HUB_PORT
PROXY_API_PORT=$PROXY_API_PORT
EXCHANGE=$EXCHANGE
COURSE_ID=$COURSE_ID
STUDENTS_GROUP=$STUDENTS_GROUP
INSTRUCTORS_GROUP=$INSTRUCTORS_GROUP
END

    # 4. the course venv (Debian's Python; outside any home, so every user can run it)
    if [ ! -x "$VENV/bin/python" ]; then
        say "creating the course venv $VENV"
        /usr/bin/python3 -m venv "$VENV"
        CHANGED=1; HUB_CHANGED=1
    fi
    # JupyterHub, and gpclab with what lectures and grading need, from this clone, not editable:
    # users import one read-only installation and never see the clone
    local want; want="$JUPYTERHUB_REQ | gpclab[lectures,grading] $(cat "$CLONE/gpclab.py" "$CLONE/pyproject.toml" | sha256sum | cut -c1-16)"
    if [ "$(cat "$VENV/.gpclab-course-installed" 2>/dev/null)" != "$want" ]; then
        say "installing JupyterHub and gpclab[lectures,grading] into $VENV (pip, a few minutes)"
        local build; build=$(mktemp -d)
        cp -r "$CLONE/gpclab.py" "$CLONE/pyproject.toml" "$CLONE/README.md" "$build/"
        [ -f "$CLONE/MANIFEST.in" ] && cp "$CLONE/MANIFEST.in" "$build/"
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
            "$JUPYTERHUB_REQ" "$build[lectures,grading]"
        rm -rf "$build"
        echo "$want" > "$VENV/.gpclab-course-installed"
        rm -f "$VENV/.gpclab-course-compiled"
        CHANGED=1; HUB_CHANGED=1
    fi
    # numba's cache, warmed once into the installation (read-only for users)
    local compiled; compiled="$(sha256sum "$("$VENV/bin/python" -c 'import importlib.util as u; print(u.find_spec("gpclab").origin)')" | cut -c1-16) $("$VENV/bin/python" -c 'import numba; print(numba.__version__)')"
    if [ "$(cat "$VENV/.gpclab-course-compiled" 2>/dev/null)" != "$compiled" ]; then
        say "warming numba's cache: gpclab compile (about a minute on two cores)"
        (cd / && PATH="$VENV/bin:$PATH" "$VENV/bin/gpclab" compile)
        echo "$compiled" > "$VENV/.gpclab-course-compiled"
        CHANGED=1
    fi

    # 5. configurable-http-proxy from npm, under the prefix
    if [ ! -x "$PREFIX/node/node_modules/.bin/configurable-http-proxy" ]; then
        say "installing configurable-http-proxy (npm)"
        mkdir -p "$PREFIX/node"
        npm install --silent --prefix "$PREFIX/node" "$CHP_REQ" >/dev/null
        CHANGED=1; HUB_CHANGED=1
    fi

    # 6. Jupyter server settings for everyone (in the venv): nbgrader's instructor extensions off
    #    (the instructor turns them on in their own ~/.jupyter below).
    #    Jupyter Server's own websocket keep-alive counts in milliseconds (30000 ms pings, a 90000 ms
    #    timeout) and hands the same numbers to tornado, which counts seconds and, since 6.5, warns
    #    at the first kernel of every server that the timeout exceeds the interval: tornado's pings
    #    never fired (30000 s) and Jupyter's are switched off here (ws_ping_interval 0). Nothing
    #    between browser and server drops idle connections on this hub (127.0.0.1, no reverse
    #    proxy); behind one with an idle timeout, keep the connections alive there.
    install_file "$HERE/jupyter_server_config.json" "$VENV/etc/jupyter/jupyter_server_config.json" 644 root:root
    install_text "$VENV/etc/jupyter/jupyter_server_config.d/zz-gpclab-course.json" 644 root:root <<'END'
{
  "ServerApp": {
    "jpserver_extensions": {
      "nbgrader.server_extensions.formgrader": false,
      "nbgrader.server_extensions.course_list": false
    }
  }
}
END
    install_text "$VENV/etc/jupyter/labconfig/page_config.json" 644 root:root <<'END'
{
  "disabledExtensions": {
    "@jupyter/nbgrader:formgrader": true,
    "@jupyter/nbgrader:course-list": true,
    "@jupyter/nbgrader:create-assignment": true
  }
}
END

    # 7. the exchange: a sticky, world-writable root (nbgrader's exchange commands require it)
    #    and this course's folder made here, owned by the instructor, before any student can
    #    log in: nobody else can create, replace or list it. inbound is write-only for students.
    #    An existing exchange root is used only if this recipe made it (its marker file) or it
    #    already is what nbgrader needs (1777, root's); its parents are never changed.
    if [ -d "$EXCHANGE" ] && [ ! -f "$EXCHANGE/$EXCHANGE_MARK" ] \
        && [ "$(stat -c '%a %U' "$EXCHANGE")" != "1777 root" ]; then
        die "$EXCHANGE exists (mode $(stat -c '%a %U' "$EXCHANGE")) and was not made by this recipe: choose another GPCLAB_EXCHANGE"
    fi
    local fresh_exchange=0; [ -d "$EXCHANGE" ] || fresh_exchange=1
    ensure_dir "$EXCHANGE" 1777 root:root
    if [ "$fresh_exchange" = 1 ]; then
        echo "gpclab course hub exchange root (exercises/hub/setup.sh); uninstall removes this folder" > "$EXCHANGE/$EXCHANGE_MARK"
    fi
    local cdir=$EXCHANGE/$COURSE_ID
    if [ -e "$cdir" ] && [ "$(stat -c %U "$cdir")" != "$INSTRUCTOR" ]; then
        die "$cdir belongs to $(stat -c %U "$cdir"), not to the instructor $INSTRUCTOR: someone made it first. Inspect and remove it, then run install again."
    fi
    ensure_dir "$cdir" 755 "$INSTRUCTOR:$igroup"
    ensure_dir "$cdir/outbound" 755 "$INSTRUCTOR:$igroup"
    ensure_dir "$cdir/inbound" 2733 "$INSTRUCTOR:$igroup"
    ensure_dir "$cdir/feedback" 711 "$INSTRUCTOR:$igroup"

    # 8. nbgrader for everyone: the exchange, the course id, and collect that refuses forgeries
    install_file "$HERE/checked_exchange.py" "$PREFIX/lib/gpclab_checked_exchange.py" 644 root:root
    # the users' server command (gpclab_course_singleuser.py: JupyterHub's, without a classic
    # notebook setting that Lab's shim warns about), importable from the venv
    install_file "$HERE/gpclab_course_singleuser.py" "$PREFIX/lib/gpclab_course_singleuser.py" 644 root:root
    install_text "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/gpclab-course.pth" \
        644 root:root <<END
$PREFIX/lib
END
    ensure_dir "$(dirname "$NBGRADER_GLOBAL")" 755 root:root
    install_text "$NBGRADER_GLOBAL" 644 root:root <<END
# written by gpclab's exercises/hub/setup.sh: every user's nbgrader reads this
c = get_config()  # noqa: F821
c.Exchange.root = "$EXCHANGE"
c.CourseDirectory.course_id = "$COURSE_ID"
# collect takes only submissions whose files belong to the student they name
# ($PREFIX/lib/gpclab_checked_exchange.py, on the course venv's path)
c.ExchangeFactory.collect = "gpclab_checked_exchange.CheckedCollect"
END
    # the instructor removes refused submissions (owned by their forger) with
    #   sudo $PREFIX/bin/remove-refused ASSIGNMENT
    install_text "$PREFIX/bin/remove-refused" 755 root:root \
        < <(remove_refused_script "$VENV/bin/python" "$PREFIX/lib/gpclab_checked_exchange.py" "$cdir/inbound")
    install_text "$SUDOERS" 440 root:root <<END
# gpclab course hub: instructors remove refused (forged) submissions from the exchange
%$INSTRUCTORS_GROUP ALL=(root) NOPASSWD: $PREFIX/bin/remove-refused
END
    visudo -cq -f "$SUDOERS" || die "$SUDOERS does not parse"

    # 9. terminals are login shells, and Debian's /etc/profile resets PATH
    install_text "$PROFILE_D" 644 root:root <<END
# gpclab course hub: the course venv (jupyter, nbgrader, gpclab) on every login shell's PATH
case ":\$PATH:" in *":$VENV/bin:"*) ;; *) PATH="$VENV/bin:\$PATH"; export PATH;; esac
END

    # 10. lectures, copied into each user's home at their first spawn (jupyterhub_config.py)
    ensure_dir "$PREFIX/lectures" 755 root:root
    local f
    for f in "$CLONE"/lectures/*.ipynb "$CLONE"/lectures/*.csv; do
        [ -e "$f" ] && install_file "$f" "$PREFIX/lectures/$(basename "$f")" 644 root:root
    done

    # 11. the instructor's course: a private copy of exercises/ (the solutions live in source/),
    #     and the formgrader pointed at it, with nbgrader's instructor extensions on
    local course=$ihome/course
    if [ ! -d "$course" ]; then
        mkdir -p "$course"
        cp -r "$CLONE/exercises/nbgrader_config.py" "$CLONE/exercises/grading_sandbox.py" \
            "$CLONE/exercises/source" "$course/"
        chown -R "$INSTRUCTOR:$igroup" "$course"
        say "copied the course (exercises/) to $course"
        CHANGED=1
    fi
    ensure_dir "$course" 700 "$INSTRUCTOR:$igroup"
    #     grade.py (parallel, resumable autograde) and the sandbox it uses, kept up to date at
    #     every install (a copy the instructor changed is kept beside it first)
    install_file "$CLONE/exercises/grade.py" "$course/grade.py" 644 "$INSTRUCTOR:$igroup"
    install_file "$CLONE/exercises/grading_sandbox.py" "$course/grading_sandbox.py" 644 "$INSTRUCTOR:$igroup"
    ensure_dir "$ihome/.jupyter" 700 "$INSTRUCTOR:$igroup"
    ensure_dir "$ihome/.jupyter/labconfig" 755 "$INSTRUCTOR:$igroup"
    install_text "$ihome/.jupyter/nbgrader_config.py" 644 "$INSTRUCTOR:$igroup" <<END
# written by gpclab's exercises/hub/setup.sh: the formgrader's course
c = get_config()  # noqa: F821
c.CourseDirectory.root = "$course"
END
    install_text "$ihome/.jupyter/jupyter_server_config.json" 644 "$INSTRUCTOR:$igroup" <<'END'
{
  "ServerApp": {
    "jpserver_extensions": {
      "nbgrader.server_extensions.formgrader": true,
      "nbgrader.server_extensions.course_list": true
    }
  }
}
END
    install_text "$ihome/.jupyter/labconfig/page_config.json" 644 "$INSTRUCTOR:$igroup" <<'END'
{
  "disabledExtensions": {
    "@jupyter/nbgrader:formgrader": false,
    "@jupyter/nbgrader:course-list": false,
    "@jupyter/nbgrader:create-assignment": false
  }
}
END

    # 12. the clone holds the solutions (exercises/source, tests/exercise_corpus): root only
    if [ "$(stat -c '%a' "$CLONE")" != 700 ] || [ "$(stat -c '%U' "$CLONE")" != root ]; then
        chown root "$CLONE"; chmod 700 "$CLONE"
        say "made the clone $CLONE private (700, root)"
    fi

    # 13. the hub: configuration, a systemd service where systemd runs the machine (the hub
    #     comes back after a reboot), then start; restart only if the hub's own configuration or
    #     software changed, which stops every user's running server
    hub_tracked install_file "$HERE/jupyterhub_config.py" "$PREFIX/etc/jupyterhub_config.py" 644 root:root
    if [ ! -s "$STATE/admin_token" ]; then
        (umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$STATE/admin_token")
        CHANGED=1; HUB_CHANGED=1
    fi
    if have_systemd; then
        hub_tracked install_text "$UNIT" 644 root:root < <(unit_text)
        if [ "$HUB_CHANGED" = 1 ]; then systemctl daemon-reload; fi
        systemctl is-enabled --quiet "$UNIT_NAME" 2>/dev/null || { systemctl enable --quiet "$UNIT_NAME"; say "enabled $UNIT_NAME (the hub starts at boot)"; CHANGED=1; }
    else
        #  no systemd (a container): the hub runs under setsid and does not come back after a
        #  reboot by itself (run setup.sh start); its log is rotated by logrotate where present
        if [ -d "$(dirname "$LOGROTATE")" ]; then install_text "$LOGROTATE" 644 root:root < <(logrotate_text); fi
    fi
    if hub_pid >/dev/null; then
        if [ "$HUB_CHANGED" = 1 ] && [ "$NO_RESTART" = 1 ]; then
            say "the hub's configuration changed; not restarting it (--no-restart): run setup.sh stop && setup.sh start when no one works (it stops every user's running server)"
        elif [ "$HUB_CHANGED" = 1 ]; then
            say "restarting the hub (its configuration changed): every user's running server stops; users start theirs again from the hub's page (unsaved changes in open notebooks are lost)"
            cmd_stop; cmd_start
        else say "the hub is running (pid $(hub_pid)) at http://127.0.0.1:$PORT/ (not restarted: its configuration is unchanged)"; fi
    else
        cmd_start
    fi
    [ "$CHANGED" = 1 ] || say "nothing to change: the set-up is complete"
}

# ---- the hub as a service ----------------------------------------------------------------------
UNIT_NAME=gpclab-hub.service
UNIT=/etc/systemd/system/$UNIT_NAME
LOGROTATE=/etc/logrotate.d/gpclab-course
have_systemd() { [ -d /run/systemd/system ] && [ "$(cat /proc/1/comm 2>/dev/null)" = systemd ]; }
unit_text() {
    cat <<END
# written by gpclab's exercises/hub/setup.sh: the course hub (log: journalctl -u $UNIT_NAME)
[Unit]
Description=gpclab course hub (JupyterHub)
After=network.target

[Service]
WorkingDirectory=$STATE
Environment=PATH=$VENV/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
ExecStart=$VENV/bin/jupyterhub -f $PREFIX/etc/jupyterhub_config.py
Restart=on-failure
RestartSec=5
# the hub stops the users' servers itself at a stop; then everything left in the unit ends
KillMode=mixed
TimeoutStopSec=60

[Install]
WantedBy=multi-user.target
END
}
logrotate_text() {
    cat <<END
# written by gpclab's exercises/hub/setup.sh: the course hub's log (setup.sh start appends to it)
$LOG {
    weekly
    maxsize 20M
    rotate 4
    compress
    missingok
    notifempty
    copytruncate
}
END
}

# add-student NAME... prints each new user's password; add-student --from FILE.csv [--passwords
# OUT.csv] takes the names from FILE's first column (a header line "name"/"username"/"user", empty
# lines and lines starting with # are skipped) and writes "name,password" lines for the users it
# created to OUT (default ./gpclab-passwords-<time>.csv), mode 600, printing no password
cmd_add_student() {
    need_root
    load_settings
    [ -f "$SETTINGS" ] || die "run setup.sh install first"
    local from="" out="" names=()
    while [ $# -gt 0 ]; do
        case $1 in
            --from) from=$2; shift 2;;
            --passwords) out=$2; shift 2;;
            -*) die "add-student: unknown option '$1'";;
            *) names+=("$1"); shift;;
        esac
    done
    if [ -n "$from" ]; then
        [ -f "$from" ] || die "add-student: no file $from"
        local line name
        while IFS= read -r line || [ -n "$line" ]; do
            line=${line%$'\r'}
            name=${line%%[,;	]*}; name=${name//\"/}; name=${name// /}
            case $name in ''|'#'*|name|username|user|login) continue;; esac
            names+=("$name")
        done < "$from"
        out=${out:-./gpclab-passwords-$(date -u +%Y%m%dT%H%M%SZ).csv}
    elif [ -n "$out" ]; then die "add-student: --passwords goes with --from"
    fi
    [ ${#names[@]} -gt 0 ] || die "add-student: name at least one student (or --from FILE.csv)"
    local n; for n in "${names[@]}"; do valid_user_name "$n" || die "add-student: '$n' is not a valid user name (lower-case letters, digits, _ . -, starting with a letter or _; prefix a numeric student id with a letter: s2301234); nothing was changed"; done
    if [ -n "$out" ]; then
        [ -e "$out" ] && die "add-student: $out exists; name another with --passwords"
        (umask 077; : > "$out")
    fi
    local created=0
    for n in "${names[@]}"; do
        ensure_user "$n" "$STUDENTS_GROUP"
        if [ -n "$out" ]; then
            if [ -n "$NEW_PASSWORD" ]; then echo "$n,$NEW_PASSWORD" >> "$out"; created=$((created + 1)); say "created user $n"; fi
        else say_password "$n"; fi
    done
    if [ -n "$out" ]; then say "$created new user(s); their passwords are in $out (mode 600): hand them out, then delete it"; fi
}

cmd_start() {
    need_root
    load_settings
    [ -f "$PREFIX/etc/jupyterhub_config.py" ] || die "run setup.sh install first"
    if hub_pid >/dev/null; then say "the hub is running (pid $(hub_pid))"; return 0; fi
    if have_systemd && [ -f "$UNIT" ]; then
        say "starting the hub at http://127.0.0.1:$PORT/ ($UNIT_NAME; log: journalctl -u $UNIT_NAME)"
        systemctl start "$UNIT_NAME"
    else
        # a bounded log where logrotate does not run: a log over 20 MiB is moved aside (one kept)
        if [ -f "$LOG" ] && [ "$(stat -c %s "$LOG")" -gt 20971520 ]; then mv -f "$LOG" "$LOG.1"; fi
        say "starting the hub at http://127.0.0.1:$PORT/ (log: $LOG)"
        (cd "$STATE" || exit 1
         PATH="$VENV/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"; export PATH
         exec setsid "$VENV/bin/jupyterhub" -f "$PREFIX/etc/jupyterhub_config.py") >>"$LOG" 2>&1 </dev/null &
    fi
    # JupyterHub writes its pid file itself (c.JupyterHub.pid_file)
    local i
    for i in $(seq 1 120); do
        sleep 1
        if hub_up && hub_pid >/dev/null; then say "the hub is up (pid $(hub_pid))"; return 0; fi
        if [ "$i" -gt 10 ] && ! hub_pid >/dev/null; then hub_log_tail >&2; die "the hub exited; see $(hub_log_name)"; fi
    done
    hub_log_tail >&2
    die "the hub did not answer within 120 s; see $(hub_log_name)"
}
hub_log_name() { if have_systemd && [ -f "$UNIT" ]; then echo "journalctl -u $UNIT_NAME"; else echo "$LOG"; fi; }
hub_log_tail() {
    if have_systemd && [ -f "$UNIT" ]; then journalctl -u "$UNIT_NAME" -n 30 --no-pager || true
    else tail -n 30 "$LOG" || true; fi
}

cmd_stop() {
    need_root
    load_settings
    local pid
    if have_systemd && [ -f "$UNIT" ] && systemctl is-active --quiet "$UNIT_NAME"; then
        systemctl stop "$UNIT_NAME"
        say "stopped the hub ($UNIT_NAME)"
    elif pid=$(hub_pid); then
        kill -TERM "$pid"
        local i
        for i in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
        say "stopped the hub (pid $pid)"
    fi
    rm -f "$PIDFILE"
    # the proxy and users' servers outlive a stopped hub: end those this hub started
    local p
    for p in $(pgrep -f "^[^ ]*node [^ ]*$PREFIX/node/" || true) $(pgrep -f "^$VENV/bin/python -m gpclab_course_singleuser" || true); do
        kill -TERM "$p" 2>/dev/null || true
    done
}

cmd_status() {
    load_settings
    if hub_pid >/dev/null && hub_up; then say "running (pid $(hub_pid)) at http://127.0.0.1:$PORT/"
    else say "not running"; return 1; fi
}

# archive [--to DIR]: the term's record in one root-only tarball: the instructor's course folder
# (gradebook.db, source, release, submitted, autograded, manual grades, feedback), the grades
# exported by `nbgrader export` (grades.csv), and the course's folder in the exchange
ARCHIVE_DIR=${GPCLAB_ARCHIVE_DIR:-/var/backups/gpclab-course}
cmd_archive() {
    need_root
    load_settings
    local to=$ARCHIVE_DIR
    while [ $# -gt 0 ]; do
        case $1 in --to) to=$2; shift 2;; *) die "archive: unknown argument '$1'";; esac
    done
    [ -n "$INSTRUCTOR" ] || { say "nothing to archive (no course.env: not installed)"; return 0; }
    local ihome=""; ihome=$(getent passwd "$INSTRUCTOR" | cut -d: -f6) || true
    local course=${ihome:+$ihome/course} cdir=$EXCHANGE/$COURSE_ID
    local parts=() extra; extra=$(mktemp -d)
    chmod 700 "$extra"
    if [ -n "$course" ] && [ -d "$course" ]; then
        parts+=("${course#/}")
        if [ -x "$VENV/bin/nbgrader" ] && [ -f "$course/gradebook.db" ]; then
            local exp; exp=$(mktemp -d); chown "$INSTRUCTOR" "$exp"
            if runuser -u "$INSTRUCTOR" -- env -i HOME="$ihome" PATH="$VENV/bin:/usr/bin:/bin" \
                sh -c 'cd "$1" && nbgrader export --to "$2/grades.csv"' sh "$course" "$exp" >/dev/null 2>&1 \
                && [ -f "$exp/grades.csv" ]; then
                cp "$exp/grades.csv" "$extra/grades.csv"
                say "exported the grades (nbgrader export: grades.csv in the archive)"
            else
                say "could not export the grades (nbgrader export failed); the gradebook is in the archive"
            fi
            rm -rf "$exp"
        fi
    fi
    if [ -d "$cdir" ]; then parts+=("${cdir#/}"); fi
    if [ ${#parts[@]} -eq 0 ] && [ ! -f "$extra/grades.csv" ]; then
        rm -rf "$extra"; say "nothing to archive (no course folder, no exchange)"; return 0
    fi
    refuse_system_dir "$to"
    # a new folder is made root's, mode 700; an existing one is left as it is (the tarball
    # itself is mode 600)
    if [ ! -d "$to" ]; then ensure_parent "$to"; mkdir -m 700 "$to"; say "created $to (700)"; fi
    local tarball; tarball="$to/gpclab-course-$(date -u +%Y%m%dT%H%M%SZ).tar.gz"
    local args=(-C / "${parts[@]}")
    if [ -f "$extra/grades.csv" ]; then args+=(-C "$extra" grades.csv); fi
    if ! (umask 077; tar -czf "$tarball" "${args[@]}"); then
        rm -rf "$extra"
        die "archive: tar failed; $tarball is incomplete (nothing was removed). Fix the cause, or uninstall --no-archive after your own copy"
    fi
    chmod 600 "$tarball"
    local with=""; if [ -f "$extra/grades.csv" ]; then with=" and grades.csv"; fi
    rm -rf "$extra"
    say "archived the course to $tarball (root only, $(du -h "$tarball" | cut -f1)): ${parts[*]/#//}$with"
    ARCHIVED=$tarball
}

cmd_uninstall() {
    need_root
    load_settings
    local keep_venv=0 remove_users=0 remove_instructor=0 archive=1
    while [ $# -gt 0 ]; do
        case $1 in --keep-venv) keep_venv=1; shift;; --remove-users) remove_users=1; shift;;
            --remove-instructor) remove_instructor=1; shift;;
            --no-archive) archive=0; shift;;
            *) die "uninstall: unknown argument '$1'";; esac
    done
    [ "$remove_instructor" = 0 ] || [ "$remove_users" = 1 ] || die "uninstall: --remove-instructor goes with --remove-users"
    refuse_system_dir "$PREFIX"
    refuse_system_dir "$EXCHANGE"
    cmd_stop
    # the term's record first (the course folder, the grades, the exchange)
    if [ "$archive" = 1 ]; then cmd_archive; fi
    if [ "$remove_users" = 1 ]; then
        # only the users this recipe created (recorded at creation), never the instructor (and
        # their course) without --remove-instructor
        local u g
        if [ -f "$CREATED_USERS" ]; then
            for u in $(sort -u "$CREATED_USERS"); do
                id "$u" >/dev/null 2>&1 || continue
                if [ "$u" = "$INSTRUCTOR" ] && [ "$remove_instructor" = 0 ]; then
                    say "kept the instructor $u and their home (--remove-instructor removes them)"; continue
                fi
                pkill -KILL -u "$u" 2>/dev/null || true
                userdel -r "$u" 2>/dev/null && say "removed user $u" || say "could not remove user $u"
            done
        else
            say "no record of users created by the recipe ($CREATED_USERS): no user removed"
        fi
        for g in "$STUDENTS_GROUP" "$INSTRUCTORS_GROUP"; do
            local left; left=$(getent group "$g" | cut -d: -f4) || true
            if [ -n "$left" ]; then say "kept group $g (members the recipe did not create, or kept: $left)"
            else groupdel "$g" 2>/dev/null || true; fi
        done
    fi
    if have_systemd && [ -f "$UNIT" ]; then
        systemctl disable --quiet "$UNIT_NAME" 2>/dev/null || true
        rm -f "$UNIT"; systemctl daemon-reload || true
    fi
    # /etc/jupyter/nbgrader_config.py only if it is still what the recipe wrote
    if [ -f "$NBGRADER_GLOBAL" ]; then
        if [ "$(sha256sum < "$NBGRADER_GLOBAL" | cut -c1-64)" = "$(written_hash "$NBGRADER_GLOBAL")" ]; then
            rm -f "$NBGRADER_GLOBAL"
        else say "kept $NBGRADER_GLOBAL: it was changed after the recipe wrote it"; fi
    fi
    rm -f "$PROFILE_D" "$SUDOERS" "$LOGROTATE"
    rmdir "$(dirname "$NBGRADER_GLOBAL")" 2>/dev/null || true
    if [ -f "$EXCHANGE/$EXCHANGE_MARK" ]; then
        remove_marked "$EXCHANGE" "$EXCHANGE_MARK" || true
    elif [ -d "$EXCHANGE/$COURSE_ID" ] && [ ! -L "$EXCHANGE/$COURSE_ID" ]; then
        rm -rf -- "${EXCHANGE:?}/$COURSE_ID"; say "removed $EXCHANGE/$COURSE_ID"
    fi
    if [ "$keep_venv" = 1 ]; then
        if [ -f "$PREFIX/$PREFIX_MARK" ] || recipe_settings; then
            find "$PREFIX" -mindepth 1 -maxdepth 1 ! -name venv ! -name node ! -name "$PREFIX_MARK" -exec rm -rf {} +
        else say "not touching $PREFIX: it has no $PREFIX_MARK"; fi
    else
        # an installation from before the marker: its course.env, as the recipe writes it
        if [ ! -f "$PREFIX/$PREFIX_MARK" ] && recipe_settings; then echo "older install" > "$PREFIX/$PREFIX_MARK"; fi
        remove_marked "$PREFIX" "$PREFIX_MARK" || true
    fi
    say "uninstalled${ARCHIVED:+ (the course is archived in $ARCHIVED)}"
}

main() {
    case ${1:-} in
        install) shift; cmd_install "$@";;
        add-student) shift; cmd_add_student "$@";;
        start) cmd_start;;
        stop) cmd_stop;;
        status) cmd_status;;
        archive) shift; cmd_archive "$@";;
        uninstall) shift; cmd_uninstall "$@";;
        *) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 2;;
    esac
}

# the whole file is read before anything runs (an edit during a run cannot change it); sourced
# (as tests/test_hub_recipe.py does), it only defines its functions
if [ "${BASH_SOURCE[0]}" = "$0" ]; then main "$@"; exit $?; fi
