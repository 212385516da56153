"""Pieces of the hub recipe (exercises/hub/setup.sh, checked_exchange.py) that need no running hub
and create no users: the root-run `remove-refused` wrapper, the path guards, the backup of files the
recipe did not write, and the checked collect's refusal of special and unreadable files.

setup.sh is sourced in bash (it then only defines its functions) with its prefix and exchange in a
temporary folder. Tests that depend on file permissions being enforced are skipped for root where
root ignores them (mode-000 reads), and the ones that need `chown` need root.
"""
import os
import pwd
import shutil
import stat
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETUP = os.path.join(ROOT, "exercises", "hub", "setup.sh")
HUB = os.path.join(ROOT, "exercises", "hub")
sys.path.insert(0, HUB)
import checked_exchange  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or os.name != "posix",
                                reason="the recipe is a bash script for Debian")
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def _bash(script, prefix, exchange="/nonexistent/exchange", check=True):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(GPCLAB_COURSE_PREFIX=str(prefix), GPCLAB_EXCHANGE=str(exchange))
    out = subprocess.run(["bash", "-c", f'source "{SETUP}"\n{script}'], capture_output=True,
                         text=True, env=env, timeout=60)
    if check and out.returncode != 0:
        raise AssertionError(f"exited {out.returncode}:\n{out.stdout}\n{out.stderr}")
    return out


def _submission(inbound, student, assignment, files=("a.ipynb",)):
    d = os.path.join(inbound, f"{student}+{assignment}+2026-01-01 10:00:00.000000 UTC+abcdef")
    os.makedirs(d)
    for f in files:
        with open(os.path.join(d, f), "w") as fh:
            fh.write("{}")
        os.chmod(os.path.join(d, f), 0o644)
    os.chmod(d, 0o777)
    return d


# ---- 1. remove-refused: one assignment name, nothing else ---------------------------------------
@pytest.fixture
def wrapper(tmp_path):
    inbound = tmp_path / "exchange" / "gpclab" / "inbound"
    inbound.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    script = _bash(f'remove_refused_script "{sys.executable}" "{HUB}/checked_exchange.py" "{inbound}"',
                   tmp_path / "prefix").stdout
    path = tmp_path / "remove-refused"
    path.write_text(script)
    path.chmod(0o755)
    return path, inbound, elsewhere


def test_remove_refused_takes_only_one_assignment_name(wrapper):
    path, inbound, elsewhere = wrapper
    # an entry elsewhere that the old wrapper (`--inbound "$inbound" "$@"`) would have removed
    # as root: owned by nobody, named as root's (refused: it belongs to nobody)
    victim = _submission(str(elsewhere), "root", "ex1")
    if IS_ROOT:
        nobody = pwd.getpwnam("nobody")
        os.chown(victim, nobody.pw_uid, nobody.pw_gid)
    for args in (["--inbound", str(elsewhere), "*"], ["--inbound=" + str(elsewhere), "ex1"],
                 ["ex1", "--inbound", str(elsewhere)], ["*"], ["../x"], [".hidden"], ["a/b"],
                 ["ex1", "ex2"], [""], [], ["-h"]):
        out = subprocess.run([str(path), *args], capture_output=True, text=True)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert "remove-refused" in out.stderr, (args, out.stderr)
        assert os.path.isdir(victim), args
    # one good name goes through to the inbound it was written for, and only there
    out = subprocess.run([str(path), "ex1"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "0 refused submission(s) removed" in out.stdout
    assert os.path.isdir(victim)


@pytest.mark.skipif(not IS_ROOT, reason="making a submission owned by another user needs root")
def test_remove_refused_removes_a_refused_entry_in_its_inbound(wrapper):
    path, inbound, _ = wrapper
    nobody = pwd.getpwnam("nobody")
    forged = _submission(str(inbound), "root", "ex1")
    os.chown(forged, nobody.pw_uid, nobody.pw_gid)
    fine = _submission(str(inbound), "root", "ex1".replace("1", "2"))
    out = subprocess.run([str(path), "ex1"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert not os.path.exists(forged) and os.path.isdir(fine)
    assert "1 refused submission(s) removed" in out.stdout


def test_remove_refused_script_refuses_bad_names_itself(tmp_path):
    for bad in ("*", "../x", ".x", "-x", "a b", "a+b"):
        with pytest.raises(SystemExit) as e:
            checked_exchange.main(["--inbound", str(tmp_path), bad])
        assert e.value.code == 2


# ---- 10. special and unreadable files in a submission ---------------------------------------
def test_fifo_in_a_submission_is_refused(tmp_path):
    d = _submission(str(tmp_path), "root", "ex1")
    os.mkfifo(os.path.join(d, "pipe"))
    assert checked_exchange.refusal_reason(d, "root") == "pipe is a named pipe (FIFO)"


def test_unreadable_file_and_folder_are_refused(tmp_path):
    d = _submission(str(tmp_path), "root", "ex1")
    os.chmod(os.path.join(d, "a.ipynb"), 0o000)
    assert checked_exchange.refusal_reason(d, "root") == \
        "a.ipynb is a file others cannot read (mode 0)"
    os.chmod(os.path.join(d, "a.ipynb"), 0o644)
    assert checked_exchange.refusal_reason(d, "root") is None
    os.mkdir(os.path.join(d, "sub"), 0o700)
    os.chmod(os.path.join(d, "sub"), 0o700)
    assert checked_exchange.refusal_reason(d, "root") == \
        "sub is a folder others cannot read (mode 700)"


def test_a_submission_as_nbgrader_submit_leaves_it_is_accepted(tmp_path):
    d = _submission(str(tmp_path), "root", "ex1", files=("a.ipynb", "timestamp.txt"))
    os.makedirs(os.path.join(d, "data"))
    os.chmod(os.path.join(d, "data"), 0o755)
    assert checked_exchange.refusal_reason(d, "root") is None


def test_collect_skips_a_submission_with_a_fifo_and_collects_the_rest(tmp_path):
    """nbgrader collect with the checked collect, on a temporary exchange: a student's submission
    holding a FIFO is reported, the other student's is collected, and collect does not hang."""
    pytest.importorskip("nbgrader")
    exchange = tmp_path / "exchange"
    inbound = exchange / "course1" / "inbound"
    inbound.mkdir(parents=True)
    os.chmod(exchange, 0o1777)
    (exchange / "course1" / "outbound").mkdir()
    good = _submission(str(inbound), "nbgood", "ex1")
    bad = _submission(str(inbound), "nbbad", "ex1")
    os.mkfifo(os.path.join(bad, "pipe"))
    course = tmp_path / "course"
    (course / "source" / "ex1").mkdir(parents=True)
    (course / "nbgrader_config.py").write_text(
        "c = get_config()\n"
        f"c.Exchange.root = {str(exchange)!r}\n"
        "c.CourseDirectory.course_id = 'course1'\n"
        "c.ExchangeFactory.collect = 'checked_exchange.CheckedCollect'\n")
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env["PYTHONPATH"] = os.pathsep.join([HUB, ROOT])
    out = subprocess.run([sys.executable, "-m", "nbgrader", "collect", "ex1"], cwd=course, env=env,
                         capture_output=True, text=True, timeout=300)
    log = out.stdout + out.stderr
    assert "REFUSED" in log and "pipe is a named pipe (FIFO)" in log, log
    assert os.path.isfile(course / "submitted" / "nbgood" / "ex1" / "a.ipynb"), log
    assert not os.path.exists(course / "submitted" / "nbbad"), log
    assert os.path.isdir(good)


def test_symlinks_in_a_submission_are_refused(tmp_path):
    """Links made by hand in the inbound folder (to the course's source notebook, its gradebook, a
    folder) refuse the submission: nbgrader's copy would copy their targets."""
    for name, target in (("notes.txt", "/course/source/ex1/ex1.ipynb"), ("gb.txt", "/course/gradebook.db"),
                         ("data", "/srv/instructor")):
        d = _submission(str(tmp_path / name), "root", "ex1")
        os.symlink(target, os.path.join(d, name))
        assert checked_exchange.refusal_reason(d, "root") == f"{name} is a symbolic link"


def test_collect_copy_follows_no_link(tmp_path):
    """The checked collect's copy of an accepted submission (a link or a named pipe swapped in after
    the check): regular files and folders are copied with their times, links and the pipe are left
    out and nothing of their targets arrives."""
    pytest.importorskip("nbgrader")
    from nbgrader.auth import Authenticator
    from nbgrader.coursedir import CourseDirectory

    secret = tmp_path / "instructor"
    secret.mkdir()
    (secret / "key.txt").write_text("PRIVATE-MARKER-4711")
    src = _submission(str(tmp_path / "inbound"), "root", "ex1")
    os.makedirs(os.path.join(src, "sub"))
    with open(os.path.join(src, "sub", "b.txt"), "w") as fh:
        fh.write("kept")
    os.utime(os.path.join(src, "a.ipynb"), (1_000_000_000, 1_000_000_000))
    os.symlink(str(secret / "key.txt"), os.path.join(src, "notes.txt"))
    os.symlink(str(secret), os.path.join(src, "data"))
    os.symlink(str(secret / "key.txt"), os.path.join(src, "sub", "x.txt"))
    os.mkfifo(os.path.join(src, "pipe"))
    collect = checked_exchange.CheckedCollect(coursedir=CourseDirectory(root=str(tmp_path)),
                                              authenticator=Authenticator())
    dest = tmp_path / "submitted"
    collect.do_copy(src, str(dest))
    found = sorted(os.path.relpath(os.path.join(b, n), dest) for b, ds, fs in os.walk(dest) for n in ds + fs)
    assert found == ["a.ipynb", "sub", os.path.join("sub", "b.txt")]
    assert (dest / "sub" / "b.txt").read_text() == "kept"
    assert os.stat(dest / "a.ipynb").st_mtime == 1_000_000_000
    assert shutil.copytree.__module__ == "shutil" and shutil.copytree.__name__ == "copytree"


# ---- 2. path guards -----------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["/", "/opt", "/opt/", "/usr", "/home", "/srv", "/tmp", "/var",
                                  "/etc", "/usr/local", "/opt/../opt", "/root"])
def test_system_folders_are_refused(tmp_path, path):
    out = _bash(f'is_system_dir "{path}" && echo SYSTEM || echo OWN', tmp_path)
    assert out.stdout.strip() == "SYSTEM"


def test_own_folders_are_not_system_folders(tmp_path):
    out = _bash(f'is_system_dir /opt/gpclab-course && echo SYSTEM || echo OWN; '
                f'is_system_dir "{tmp_path}/x" && echo SYSTEM || echo OWN', tmp_path)
    assert out.stdout.split() == ["OWN", "OWN"]


def test_uninstall_removes_only_a_marked_prefix(tmp_path):
    plain = tmp_path / "plain"
    (plain / "keep").mkdir(parents=True)
    out = _bash(f'remove_marked "{plain}" "$PREFIX_MARK" || echo REFUSED', tmp_path)
    assert "REFUSED" in out.stdout and "did not make it" in out.stdout
    assert (plain / "keep").is_dir()
    marked = tmp_path / "marked"
    marked.mkdir()
    out = _bash(f'touch "{marked}/$PREFIX_MARK"; remove_marked "{marked}" "$PREFIX_MARK"', tmp_path)
    assert not marked.exists()
    # a system folder is refused even with the marker in it (nothing is written there: the
    # check comes first)
    out = _bash('remove_marked /opt "$PREFIX_MARK" || echo REFUSED', tmp_path)
    assert "REFUSED" in out.stdout and "system folder" in out.stdout
    assert os.path.isdir("/opt")


def test_ensure_dir_leaves_an_existing_parent_alone(tmp_path):
    parent = tmp_path / "parent"
    parent.mkdir()
    parent.chmod(0o1777)
    out = _bash(f'ensure_dir "{parent}/exchange" 1777 "$(id -un):$(id -gn)"', tmp_path)
    assert stat.S_IMODE(os.stat(parent).st_mode) == 0o1777, out.stdout
    assert stat.S_IMODE(os.stat(parent / "exchange").st_mode) == 0o1777
    # a missing parent is made (755), nothing above it changes
    _bash(f'ensure_dir "{parent}/a/b" 700 "$(id -un):$(id -gn)"', tmp_path)
    assert stat.S_IMODE(os.stat(parent).st_mode) == 0o1777
    assert stat.S_IMODE(os.stat(parent / "a" / "b").st_mode) == 0o700
    out = _bash('ensure_dir /tmp 755 root:root', tmp_path, check=False)
    assert out.returncode != 0 and "system folder" in out.stderr


# ---- 4. backups of files the recipe did not write ------------------------------------------------
def test_a_file_the_recipe_did_not_write_is_kept(tmp_path):
    prefix = tmp_path / "prefix"
    (prefix / "state").mkdir(parents=True)
    dest = tmp_path / "etc" / "nbgrader_config.py"
    dest.parent.mkdir()
    dest.write_text("# the admin's own\n")
    me = "$(id -un):$(id -gn)"
    out = _bash(f'echo ours | install_text "{dest}" 644 "{me}"', prefix)
    backups = [f for f in os.listdir(dest.parent) if f.startswith("nbgrader_config.py.before-gpclab-")]
    assert len(backups) == 1, out.stdout
    assert (dest.parent / backups[0]).read_text() == "# the admin's own\n"
    assert dest.read_text() == "ours\n"
    assert "kept" in out.stdout
    # what the recipe wrote itself is replaced without a backup; a hand edit after it is kept
    _bash(f'echo ours again | install_text "{dest}" 644 "{me}"', prefix)
    assert len([f for f in os.listdir(dest.parent) if ".before-gpclab-" in f]) == 1
    dest.write_text("edited by hand\n")
    import time
    time.sleep(1.1)         # the backup's name has the second
    _bash(f'echo ours | install_text "{dest}" 644 "{me}"', prefix)
    kept = sorted(f for f in os.listdir(dest.parent) if ".before-gpclab-" in f)
    assert len(kept) == 2 and (dest.parent / kept[-1]).read_text() == "edited by hand\n"


# ---- 6. only a change of the hub's own configuration asks for a restart -------------------------
def test_hub_tracked_marks_only_tracked_changes(tmp_path):
    prefix = tmp_path / "prefix"
    (prefix / "state").mkdir(parents=True)
    me = "$(id -un):$(id -gn)"
    # (here-strings: a pipe would run the function in a subshell, losing the flags)
    out = _bash(f'install_text "{tmp_path}/lecture" 644 "{me}" <<< a; echo "$CHANGED $HUB_CHANGED"; '
                f'hub_tracked install_text "{tmp_path}/hubconf" 644 "{me}" <<< b; echo "$CHANGED $HUB_CHANGED"',
                prefix)
    assert out.stdout.split("\n")[1::2][:2] == ["1 0", "1 1"], out.stdout
    out = _bash(f'hub_tracked install_text "{tmp_path}/hubconf" 644 "{me}" <<< b; echo "$CHANGED $HUB_CHANGED"',
                prefix)
    assert out.stdout.strip() == "0 0", out.stdout


# ---- 5. archive --------------------------------------------------------------------------------
@pytest.mark.skipif(not IS_ROOT, reason="archive runs as root")
def test_archive_is_a_root_only_tarball_of_the_exchange_and_course(tmp_path):
    import tarfile
    prefix = tmp_path / "prefix"
    (prefix / "etc").mkdir(parents=True)
    exchange = tmp_path / "exchange"
    (exchange / "gpclab" / "inbound").mkdir(parents=True)
    (exchange / "gpclab" / "inbound" / "work.txt").write_text("submitted")
    (prefix / "etc" / "course.env").write_text(
        f"INSTRUCTOR=nobody\nPORT=8000\nHUB_PORT=8081\nPROXY_API_PORT=8001\nEXCHANGE={exchange}\n"
        "COURSE_ID=gpclab\nSTUDENTS_GROUP=x\nINSTRUCTORS_GROUP=y\n")
    arch = tmp_path / "backups" / "course"
    out = _bash(f'cmd_archive --to "{arch}"', prefix, exchange)
    tarballs = list(arch.glob("gpclab-course-*.tar.gz"))
    assert len(tarballs) == 1, out.stdout
    assert stat.S_IMODE(os.stat(arch).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tarballs[0]).st_mode) == 0o600 and os.stat(tarballs[0]).st_uid == 0
    with tarfile.open(tarballs[0]) as t:
        names = t.getnames()
    assert str(exchange / "gpclab" / "inbound" / "work.txt").lstrip("/") in names, names
    out = _bash('cmd_archive --to /var', prefix, exchange, check=False)
    assert out.returncode != 0 and "system folder" in out.stderr


# ---- 9. add-student --from a CSV file, passwords to a mode-600 file ------------------------------
@pytest.mark.skipif(not IS_ROOT, reason="add-student runs as root")
def test_add_student_from_csv_writes_a_private_password_file(tmp_path):
    prefix = tmp_path / "prefix"
    (prefix / "etc").mkdir(parents=True)
    (prefix / "etc" / "course.env").write_text("INSTRUCTOR=nobody\n")
    csv = tmp_path / "class.csv"
    csv.write_text('name,email\n"s2301234",a@x\n# a comment\n\nbo.li;x\r\ngpc_c\n')
    out_file = tmp_path / "pw.csv"
    # no user is created: ensure_user is replaced by a stand-in that records its calls
    stub = f'ensure_user() {{ echo "$1 $2" >> "{tmp_path}/calls"; NEW_PASSWORD=pw-$1; }}'
    out = _bash(f'{stub}\ncmd_add_student --from "{csv}" --passwords "{out_file}"', prefix)
    assert (tmp_path / "calls").read_text().split("\n")[:3] == \
        ["s2301234 gpclab-students", "bo.li gpclab-students", "gpc_c gpclab-students"]
    assert stat.S_IMODE(os.stat(out_file).st_mode) == 0o600
    assert out_file.read_text() == "s2301234,pw-s2301234\nbo.li,pw-bo.li\ngpc_c,pw-gpc_c\n"
    assert "pw-" not in out.stdout
    # a numeric id is refused before anything is done, with the way out in the message
    csv.write_text("2301234\n")
    out = _bash(f'{stub}\ncmd_add_student --from "{csv}" --passwords "{tmp_path}/pw2.csv"', prefix,
                check=False)
    assert out.returncode != 0 and "s2301234" in out.stderr
    assert not (tmp_path / "pw2.csv").exists()


def test_files_in_the_prefix_are_replaced_without_a_backup(tmp_path):
    prefix = tmp_path / "prefix"
    (prefix / "state").mkdir(parents=True)
    (prefix / "bin").mkdir()
    dest = prefix / "bin" / "remove-refused"
    dest.write_text("an older wrapper\n")
    _bash(f'install_text "{dest}" 755 "$(id -un):$(id -gn)" <<< new', prefix)
    assert dest.read_text() == "new\n"
    assert os.listdir(prefix / "bin") == ["remove-refused"]


# ---- 2, 3, 5. uninstall, on a fake installation in a temporary folder ---------------------------
def _fake_install(tmp_path, marked=True):
    """A prefix, an exchange and the recipe's /etc files, all under tmp_path; the users it
    'created' do not exist (so none is touched)."""
    prefix, exchange, etc = tmp_path / "prefix", tmp_path / "exchange", tmp_path / "etc"
    for d in (prefix / "etc", prefix / "state", prefix / "venv", exchange / "gpclab" / "inbound", etc):
        d.mkdir(parents=True)
    if marked:
        (prefix / ".gpclab-course-prefix").write_text("x")
        (exchange / ".gpclab-course-exchange").write_text("x")
    (exchange / "gpclab" / "inbound" / "work.txt").write_text("submitted")
    (prefix / "etc" / "course.env").write_text(
        f"INSTRUCTOR=nobody\nPORT=8000\nHUB_PORT=8081\nPROXY_API_PORT=8001\nEXCHANGE={exchange}\n"
        "COURSE_ID=gpclab\nSTUDENTS_GROUP=gpcrecipe-nogroup-s\nINSTRUCTORS_GROUP=gpcrecipe-nogroup-i\n")
    (prefix / "state" / "created-users").write_text("gpcrecipe-nouser-1\n")
    stubs = (f'NBGRADER_GLOBAL="{etc}/jupyter/nbgrader_config.py"; PROFILE_D="{etc}/profile.sh"; '
             f'SUDOERS="{etc}/sudoers"; LOGROTATE="{etc}/logrotate"; UNIT="{etc}/unit"\n'
             'cmd_stop() { :; }; have_systemd() { false; }\n')
    (etc / "jupyter").mkdir()
    _bash(stubs + 'install_text "$NBGRADER_GLOBAL" 644 "$(id -un):$(id -gn)" <<< ours', prefix, exchange)
    return prefix, exchange, etc, stubs


@pytest.mark.skipif(not IS_ROOT, reason="uninstall runs as root")
def test_uninstall_archives_then_removes_what_the_recipe_made(tmp_path):
    import tarfile
    prefix, exchange, etc, stubs = _fake_install(tmp_path)
    arch = tmp_path / "archive"
    env_script = f'export GPCLAB_ARCHIVE_DIR="{arch}"; source "{SETUP}"\n' + stubs
    out = _bash(env_script + 'cmd_uninstall --remove-users', prefix, exchange)
    assert not prefix.exists() and not exchange.exists(), out.stdout
    assert not (etc / "jupyter").exists()
    (tarball,) = arch.glob("gpclab-course-*.tar.gz")
    with tarfile.open(tarball) as t:
        assert str(exchange / "gpclab" / "inbound" / "work.txt").lstrip("/") in t.getnames()
    assert "archived the course to" in out.stdout


@pytest.mark.skipif(not IS_ROOT, reason="uninstall runs as root")
def test_uninstall_keeps_an_unmarked_prefix_and_a_changed_global_config(tmp_path):
    prefix, exchange, etc, stubs = _fake_install(tmp_path, marked=False)
    (etc / "jupyter" / "nbgrader_config.py").write_text("edited by the admin\n")
    (prefix / "etc" / "course.env").unlink()        # not the recipe's prefix at all
    (prefix / "etc" / "course.env").write_text(f"EXCHANGE={exchange}\n")
    out = _bash(stubs + 'cmd_uninstall --no-archive', prefix, exchange)
    assert (prefix / "venv").is_dir(), out.stdout
    assert (etc / "jupyter" / "nbgrader_config.py").read_text() == "edited by the admin\n"
    assert "kept" in out.stdout and "no .gpclab-course-prefix" in out.stdout
    # the exchange root (unmarked) stays; only the course's folder in it goes
    assert exchange.is_dir() and not (exchange / "gpclab").exists()
    out = _bash(stubs + 'cmd_uninstall --no-archive', "/opt", exchange, check=False)
    assert out.returncode != 0 and "system folder" in out.stderr


# ---- the whole install, twice, with every system-wide effect moved into a temporary folder -----
@pytest.mark.skipif(not IS_ROOT, reason="install runs as root")
def test_install_twice_in_a_sandboxed_prefix(tmp_path):
    """cmd_install's own logic end to end, with nothing outside tmp_path touched: no user or group
    is made (stand-ins), no package installed (a stand-in venv python whose pip does nothing and a
    stand-in proxy), the /etc files and the clone moved under tmp_path, the hub's start stubbed.
    The second run must change nothing and must not restart the hub; a changed hub
    configuration must restart it, unless --no-restart."""
    clone = tmp_path / "clone"
    (clone / "exercises").mkdir(parents=True)
    for f in ("gpclab.py", "pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, f), clone / f)
    for f in ("grade.py", "grading_sandbox.py", "nbgrader_config.py"):
        shutil.copy(os.path.join(ROOT, "exercises", f), clone / "exercises" / f)
    shutil.copytree(os.path.join(ROOT, "exercises", "source"), clone / "exercises" / "source")
    shutil.copytree(os.path.join(ROOT, "lectures"), clone / "lectures")
    prefix, exchange, etc, home = (tmp_path / "prefix", tmp_path / "srv" / "exchange",
                                   tmp_path / "etc", tmp_path / "home" / "prof")
    home.mkdir(parents=True)
    os.chown(home, pwd.getpwnam("nobody").pw_uid, -1)
    (prefix / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "purelib").mkdir()
    (prefix / "venv" / "bin" / "python").write_text(
        "#!/bin/sh\n"
        'case "$*" in *"-m pip"*) exit 0;; *sysconfig*) echo ' + str(tmp_path / "purelib") + "; exit 0;; esac\n"
        f'exec {sys.executable} "$@"\n')
    (prefix / "venv" / "bin" / "gpclab").write_text("#!/bin/sh\nexit 0\n")
    chp = prefix / "node" / "node_modules" / ".bin" / "configurable-http-proxy"
    chp.parent.mkdir(parents=True)
    chp.write_text("#!/bin/sh\n")
    for p in (prefix / "venv" / "bin" / "python", prefix / "venv" / "bin" / "gpclab", chp):
        p.chmod(0o755)
    (prefix / ".gpclab-course-prefix").write_text("x")
    (etc / "jupyter").mkdir(parents=True)
    stubs = f'''
NBGRADER_GLOBAL="{etc}/jupyter/nbgrader_config.py"; PROFILE_D="{etc}/profile.sh"
SUDOERS="{etc}/sudoers"; LOGROTATE="{etc}/logrotate.d/gpclab"; UNIT="{etc}/unit"; CLONE="{clone}"
have_systemd() {{ false; }}
ensure_group() {{ :; }}
ensure_user() {{ NEW_PASSWORD=""; }}
getent() {{ if [ "$*" = "passwd nobody" ]; then echo "nobody:x:65534:65534::{home}:/bin/sh"; else command getent "$@"; fi; }}
RUNNING=0
hub_pid() {{ [ -f "{tmp_path}/running" ] && echo 4242; }}
cmd_start() {{ touch "{tmp_path}/running"; echo STARTED; }}
cmd_stop() {{ rm -f "{tmp_path}/running"; echo STOPPED; }}
'''
    # the instructor's own nbgrader configuration, which the recipe replaces: kept beside it
    (home / ".jupyter").mkdir()
    (home / ".jupyter" / "nbgrader_config.py").write_text("# mine\n")
    args = "cmd_install --instructor nobody --port 18000 --hub-port 18081 --proxy-api-port 18001"
    out1 = _bash(stubs + args, prefix, exchange)
    assert not out1.stderr, out1.stderr
    assert "STARTED" in out1.stdout, out1.stdout
    remove = (prefix / "bin" / "remove-refused").read_text()
    assert f'--inbound "{exchange}/gpclab/inbound" -- "$1"' in remove
    assert (home / "course" / "grade.py").read_bytes() == (clone / "exercises" / "grade.py").read_bytes()
    assert stat.S_IMODE(os.stat(tmp_path / "srv").st_mode) == 0o755       # made, as a parent
    assert stat.S_IMODE(os.stat(exchange).st_mode) == 0o1777
    assert (exchange / ".gpclab-course-exchange").is_file()
    assert stat.S_IMODE(os.stat(clone).st_mode) == 0o700
    out2 = _bash(stubs + args.split(" --port")[0], prefix, exchange)
    assert "nothing to change" in out2.stdout and "STOPPED" not in out2.stdout, out2.stdout
    assert "not restarted" in out2.stdout
    # the hub's configuration changes (a new port): a restart, said first; --no-restart defers
    out3 = _bash(stubs + "cmd_install --instructor nobody --port 18002 --no-restart", prefix, exchange)
    assert "STOPPED" not in out3.stdout and "--no-restart" in out3.stdout, out3.stdout
    out4 = _bash(stubs + "cmd_install --instructor nobody --port 18003", prefix, exchange)
    assert "restarting the hub" in out4.stdout and "STOPPED" in out4.stdout, out4.stdout
    # a lecture changed: copied, no restart
    with open(clone / "lectures" / os.listdir(clone / "lectures")[0], "a") as f:
        f.write(" ")
    out5 = _bash(stubs + "cmd_install --instructor nobody", prefix, exchange)
    assert "wrote" in out5.stdout and "STOPPED" not in out5.stdout, out5.stdout
    (kept,) = [f for f in os.listdir(home / ".jupyter") if f.startswith("nbgrader_config.py.before-gpclab-")]
    assert (home / ".jupyter" / kept).read_text() == "# mine\n"
    # the end of term: archive (the course with grade.py, the exchange), then everything goes
    import tarfile
    out6 = _bash(f'export GPCLAB_ARCHIVE_DIR="{tmp_path}/archive"; source "{SETUP}"\n' + stubs
                 + "cmd_uninstall --remove-users", prefix, exchange)
    (tarball,) = (tmp_path / "archive").glob("*.tar.gz")
    with tarfile.open(tarball) as t:
        names = t.getnames()
    assert str(home / "course" / "grade.py").lstrip("/") in names
    assert str(exchange / "gpclab" / "inbound").lstrip("/") in names
    assert not prefix.exists() and not exchange.exists(), out6.stdout
    assert (tmp_path / "srv").is_dir() and (home / "course").is_dir()      # not the recipe's to remove
    assert not (etc / "jupyter").exists() and not (etc / "sudoers").exists()
