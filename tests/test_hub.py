"""A term on a real JupyterHub, set up by exercises/hub/setup.sh (needs root).

The recipe installs a course hub on 127.0.0.1 (its own ports) with throwaway Unix users: one
instructor and four students. Through the hub's REST API and each user's server (jupyter_server's
REST API, kernels over websockets, the formgrader's API) and nbgrader commands run in the users'
login shells (`runuser -l`, as a Jupyter terminal runs them), the test runs a term: four students'
first lecture cells at once; the instructor releases two assignments; the students fetch, answer
(right, partly wrong, empty; from tests/exercise_corpus/) and submit; a forged submission is
refused at collect; autograde in the sandbox; grading by hand in the formgrader; feedback released
and fetched. Then every way of reading or forging another's work it knows is tried, and each must
be refused. Teardown removes the users, the hub and every process it started, however the test
ends, and `setup.sh uninstall` the recipe's files.

The recipe's installation (pip, npm, `gpclab compile`) takes a few minutes. For reruns, set
GPCLAB_HUB_TEST_PREFIX to a folder (e.g. /opt/gpclab-hubtest): its venv and proxy are kept after
the test and reused by the next run (the recipe only checks them).
"""
import asyncio
import copy
import glob
import json
import os
import pwd
import re
import runpy
import shutil
import socket
import stat
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETUP = os.path.join(ROOT, "exercises", "hub", "setup.sh")
CORPUS = os.path.join(ROOT, "tests", "exercise_corpus")
INSTRUCTOR = "gpc-prof"
STUDENTS = ["gpc-ada", "gpc-ben", "gpc-cy", "gpc-dee"]
ASSIGNMENTS = ["ex3_10_4", "ex3_10_5"]
LECTURE = "sec3_04_binary_laplace.ipynb"
KEEP = os.environ.get("GPCLAB_HUB_TEST_PREFIX")
PREFIX = KEEP or "/opt/gpclab-hubtest"
EXCHANGE = "/srv/gpclab-hubtest/exchange"
ARCHIVE = "/srv/gpclab-hubtest/archive"        # uninstall's end-of-term archive (removed at teardown)
MANUAL_SCORE = 2.0

pytestmark = [
    pytest.mark.skipif(os.name != "posix" or not hasattr(os, "geteuid") or os.geteuid() != 0,
                       reason="the hub test creates Unix users and runs a JupyterHub: it needs root"),
    pytest.mark.skipif(not os.path.exists("/etc/debian_version") or shutil.which("useradd") is None,
                       reason="the hub recipe is for Debian (apt-get, useradd, PAM)"),
]

RESULTS = {}        # measured figures, printed at the end


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(args, check=True, timeout=900, env=None, **kw):
    env = {k: v for k, v in (env or os.environ).items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    out = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env, **kw)
    if check and out.returncode != 0:
        raise AssertionError(f"{args} exited {out.returncode}:\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}")
    return out


def _setup(*args, check=True):
    env = dict(os.environ, GPCLAB_COURSE_PREFIX=PREFIX, GPCLAB_EXCHANGE=EXCHANGE,
               GPCLAB_ARCHIVE_DIR=ARCHIVE)
    return _run(["bash", SETUP, *args], check=check, env=env, timeout=1800)


def as_user(user, command, check=True, timeout=600):
    """`command` in `user`'s login shell (as a Jupyter terminal runs it: /etc/profile applies)."""
    return _run(["runuser", "-l", user, "-c", command], check=check, timeout=timeout, cwd="/")


class Hub:
    def __init__(self, port):
        self.url = f"http://127.0.0.1:{port}"
        with open(os.path.join(PREFIX, "state", "admin_token")) as f:
            self.token = f.read().strip()

    def request(self, method, path, body=None, expect=(200, 201, 204), raw=False, timeout=120):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Authorization": f"token {self.token}",
                                              "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                status, text = r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read().decode(errors="replace")
        if expect is not None:
            assert status in expect, f"{method} {path}: {status} {text[:2000]}"
        if raw:
            return status, text
        return json.loads(text) if text.strip() else None


@pytest.fixture(scope="module")
def hub():
    taken = [u for u in [INSTRUCTOR] + STUDENTS if _user_exists(u)]
    if taken or os.path.exists("/etc/jupyter/nbgrader_config.py") or _group_exists("gpclab-students"):
        pytest.skip("a course hub (or its users: " + ", ".join(taken) + ") is installed on this "
                    "machine; the test would change it")
    clone_mode = stat.S_IMODE(os.stat(ROOT).st_mode)
    ports = [_free_port() for _ in range(3)]
    t0 = time.time()
    try:
        out = _setup("install", "--instructor", INSTRUCTOR, "--port", str(ports[0]),
                     "--hub-port", str(ports[1]), "--proxy-api-port", str(ports[2]))
        RESULTS["install"] = (time.time() - t0, os.getloadavg()[0])
        RESULTS["install_log"] = out.stdout
        t0 = time.time()
        out = _setup("add-student", *STUDENTS)
        RESULTS["add_students"] = time.time() - t0
        RESULTS["passwords"] = dict(re.findall(r"created user (\S+) with password: (\S+)",
                                               RESULTS["install_log"] + out.stdout))
        yield Hub(ports[0])
    finally:
        _teardown(clone_mode)
        for k, v in RESULTS.items():
            if k not in ("install_log", "passwords"):
                print(f"hub test: {k}: {v}")


def _user_exists(name):
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def _group_exists(name):
    return subprocess.run(["getent", "group", name], capture_output=True).returncode == 0


def _teardown(clone_mode):
    """Everything the test made goes, however it ended: the hub and its proxy, the users' servers
    and processes, the users, the recipe's files (the venv too unless GPCLAB_HUB_TEST_PREFIX)."""
    args = ["uninstall", "--remove-users", "--remove-instructor"] + (["--keep-venv"] if KEEP else [])
    try:
        _setup(*args, check=False)
    finally:
        for u in [INSTRUCTOR] + STUDENTS:
            if _user_exists(u):
                subprocess.run(["pkill", "-KILL", "-u", u], capture_output=True)
                time.sleep(0.5)
                subprocess.run(["userdel", "-r", u], capture_output=True)
        for g in ("gpclab-students", "gpclab-instructors"):
            subprocess.run(["groupdel", g], capture_output=True)
        shutil.rmtree(os.path.dirname(EXCHANGE), ignore_errors=True)
        os.chmod(ROOT, clone_mode)


# ---- helpers on the users' servers -----------------------------------------------------------------
def _start_servers(hub, users):
    for u in users:
        hub.request("POST", f"/hub/api/users/{u}", expect=(201, 409))
    t0 = time.time()
    for u in users:
        hub.request("POST", f"/hub/api/users/{u}/server", expect=(201, 202, 400))
    ready = {}
    while len(ready) < len(users) and time.time() - t0 < 240:
        for u in users:
            if u not in ready and hub.request("GET", f"/hub/api/users/{u}")["servers"].get("", {}).get("ready"):
                ready[u] = time.time() - t0
        time.sleep(0.3)
    assert len(ready) == len(users), f"servers not ready after 240 s: {set(users) - set(ready)}"
    return ready


async def _execute(url, token, user, kernel_id, code, timeout=300):
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect
    ws_url = url.replace("http://", "ws://") + f"/user/{user}/api/kernels/{kernel_id}/channels"
    # a loaded machine: the server answers the websocket once the new kernel replies (tornado's
    # default gives up after 20 s)
    conn = await websocket_connect(HTTPRequest(ws_url, headers={"Authorization": f"token {token}"},
                                               connect_timeout=180, request_timeout=180))
    msg_id = uuid.uuid4().hex
    conn.write_message(json.dumps({
        "header": {"msg_id": msg_id, "username": user, "session": uuid.uuid4().hex,
                   "msg_type": "execute_request", "version": "5.3"},
        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
        "content": {"code": code, "silent": False, "store_history": True,
                    "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}}))
    reply, idle, errors = None, False, []
    deadline = time.time() + timeout
    while not (reply and idle):
        raw = await asyncio.wait_for(conn.read_message(), max(1.0, deadline - time.time()))
        assert raw is not None, "kernel websocket closed"
        msg = json.loads(raw)
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "execute_reply":
            reply = msg["content"]
        elif msg["msg_type"] == "error":
            errors.append("\n".join(msg["content"]["traceback"]))
        elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            idle = True
    conn.close()
    return reply, errors


def _first_cells(hub, user, cells, out):
    k = hub.request("POST", f"/user/{user}/api/kernels", {"name": "python3"})
    try:
        times = []
        for code in cells:
            t0 = time.time()
            reply, errors = asyncio.run(_execute(hub.url, hub.token, user, k["id"], code))
            times.append(time.time() - t0)
            assert reply["status"] == "ok", f"{user}: {errors}"
        out[user] = times
    finally:
        hub.request("DELETE", f"/user/{user}/api/kernels/{k['id']}", expect=None)


def _in_parallel(fn, users):
    """fn(user) for every user at once (as students work); the first failure is raised."""
    errors = {}

    def run(u):
        try:
            fn(u)
        except BaseException as e:     # noqa: BLE001  (re-raised below)
            errors[u] = e
    threads = [threading.Thread(target=run, args=(u,)) for u in users]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for u, e in errors.items():
        raise AssertionError(f"{u}: {e}") from e


# ---- the corpus's answers ---------------------------------------------------------------------------
def _strip_solution_markers(src):
    return "\n".join(line for line in src.split("\n")
                     if "### BEGIN SOLUTION" not in line and "### END SOLUTION" not in line)


def _answered(release_nb, source_nb, answers):
    """The fetched notebook with every answer cell filled: `answers` by grade id, else the
    instructor's solution; Markdown answers get a typed text."""
    nb = copy.deepcopy(release_nb)
    solutions = {c["metadata"]["nbgrader"]["grade_id"]: _strip_solution_markers("".join(c["source"]))
                 for c in source_nb["cells"] if c["metadata"].get("nbgrader", {}).get("solution")}
    for cell in nb["cells"]:
        meta = cell["metadata"].get("nbgrader", {})
        if meta.get("solution"):
            gid = meta["grade_id"]
            cell["source"] = ("The derivation, typed by the student." if cell["cell_type"] == "markdown"
                              else answers.get(gid, solutions[gid]).strip("\n"))
    return nb


def _points(source_nb):
    """Points of each autograded test cell and of the manual cells, from the source notebook."""
    auto, manual = {}, {}
    for c in source_nb["cells"]:
        m = c["metadata"].get("nbgrader", {})
        if m.get("grade"):
            (manual if m.get("solution") else auto)[m["grade_id"]] = float(m["points"])
    return auto, manual


def _only_loopback():
    """Every socket the hub, its proxy and the users' servers and kernels listen on is on
    127.0.0.1."""
    with open(os.path.join(PREFIX, "state", "jupyterhub.pid")) as f:
        hub_pid = f.read().strip()
    pids = {hub_pid} | set(_run(["pgrep", "-P", hub_pid], check=False).stdout.split())
    for u in [INSTRUCTOR] + STUDENTS:
        pids |= set(_run(["pgrep", "-u", u], check=False).stdout.split())
    seen = 0
    for line in _run(["ss", "-Hltnp"]).stdout.splitlines():
        owners = set(re.findall(r"pid=(\d+)", line))
        if owners & pids:
            seen += 1
            assert line.split()[3].startswith("127.0.0.1:"), line
    assert seen >= 3 + len(STUDENTS), f"only {seen} listening sockets found for the hub and its servers"


def _denied(user, command, path):
    """`command` as `user` must be refused by the system ("Permission denied", or "Operation not
    permitted" for the sticky exchange root) on `path`, which exists."""
    assert os.path.lexists(path), f"{path} does not exist: the attempt would prove nothing"
    out = as_user(user, command, check=False)
    refused = out.returncode != 0 and re.search("Permission denied|Operation not permitted",
                                                out.stdout + out.stderr) is not None
    RESULTS.setdefault("access", []).append(
        (user, command, "refused" if refused else f"ALLOWED: {out.stdout[:200]!r}"))
    assert refused, f"{user} could: {command}\n{out.stdout[:2000]}{out.stderr[:2000]}"


# ---- the term --------------------------------------------------------------------------------------
def test_recipe_twice_changes_nothing(hub):
    """A second `setup.sh install` changes no file, mode, owner, user or package, and keeps the
    running hub."""
    def snapshot():
        paths = [os.path.join(PREFIX, "etc"), os.path.join(PREFIX, "bin"), os.path.join(PREFIX, "lib"),
                 os.path.join(PREFIX, "lectures"), "/etc/jupyter", "/etc/profile.d/gpclab-course.sh",
                 "/etc/sudoers.d/gpclab-course", EXCHANGE, os.path.join(PREFIX, "venv", "etc"),
                 ROOT] + [pwd.getpwnam(u).pw_dir for u in [INSTRUCTOR] + STUDENTS]
        snap = {}
        for top in paths:
            for folder, dirs, files in os.walk(top):
                if folder == ROOT:
                    dirs[:] = []        # the clone itself: its mode and owner only
                for p in [folder] + [os.path.join(folder, f) for f in files]:
                    st = os.lstat(p)
                    digest = None
                    if stat.S_ISREG(st.st_mode) and folder != ROOT:
                        with open(p, "rb") as f:
                            digest = hash(f.read())
                    snap[p] = (stat.filemode(st.st_mode), st.st_uid, st.st_gid, digest)
        snap["passwd"] = subprocess.run(["getent", "passwd"], capture_output=True, text=True).stdout
        snap["group"] = subprocess.run(["getent", "group"], capture_output=True, text=True).stdout
        snap["pip"] = _run([os.path.join(PREFIX, "venv", "bin", "python"), "-m", "pip", "freeze"]).stdout
        with open(os.path.join(PREFIX, "state", "jupyterhub.pid")) as f:
            snap["hub pid"] = f.read()
        return snap

    before = snapshot()
    t0 = time.time()
    out = _setup("install")
    RESULTS["install_again"] = time.time() - t0
    after = snapshot()
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    assert not changed, f"a second install changed {sorted(changed)[:20]}"
    assert "nothing to change" in out.stdout, out.stdout


def test_set_up(hub):
    """What the recipe promises, checked on the machine."""
    venv_bin = os.path.join(PREFIX, "venv", "bin")
    # terminals are login shells: the course venv is on their PATH
    assert as_user(STUDENTS[0], "command -v nbgrader").stdout.strip() == os.path.join(venv_bin, "nbgrader")
    # private homes, the private course folder and clone; the exchange's course folder
    for u in [INSTRUCTOR] + STUDENTS:
        assert stat.S_IMODE(os.stat(pwd.getpwnam(u).pw_dir).st_mode) == 0o700, u
    course = os.path.join(pwd.getpwnam(INSTRUCTOR).pw_dir, "course")
    assert stat.S_IMODE(os.stat(course).st_mode) == 0o700
    # grade.py in the course, the instructor's, the clone's version
    with open(os.path.join(course, "grade.py"), "rb") as a, \
            open(os.path.join(ROOT, "exercises", "grade.py"), "rb") as b:
        assert a.read() == b.read()
    assert pwd.getpwuid(os.stat(os.path.join(course, "grade.py")).st_uid).pw_name == INSTRUCTOR
    # the prefix and the exchange root carry the recipe's markers (uninstall removes only those)
    assert os.path.isfile(os.path.join(PREFIX, ".gpclab-course-prefix"))
    assert os.path.isfile(os.path.join(EXCHANGE, ".gpclab-course-exchange"))
    assert stat.S_IMODE(os.stat(ROOT).st_mode) == 0o700 and os.stat(ROOT).st_uid == 0
    st = os.stat(os.path.join(EXCHANGE, "gpclab", "inbound"))
    assert (oct(stat.S_IMODE(st.st_mode)), pwd.getpwuid(st.st_uid).pw_name) == ("0o2733", INSTRUCTOR)
    # the installed gpclab is not the clone's file, and its warmed cache is there
    origin = _run([os.path.join(venv_bin, "python"), "-c",
                   "import importlib.util as u; print(u.find_spec('gpclab').origin)"], cwd="/").stdout.strip()
    assert origin.startswith(os.path.join(PREFIX, "venv")), origin
    assert glob.glob(os.path.join(os.path.dirname(origin), "__pycache__", "gpclab*.nbc"))


def test_log_in(hub):
    """Users log in at the hub with the Unix password setup.sh printed (PAM); a wrong one is
    refused."""
    import http.cookiejar
    import urllib.parse

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kw):
            return None

    def log_in(user, password):
        opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()), NoRedirect)
        page = opener.open(hub.url + "/hub/login", timeout=60).read().decode()
        xsrf = re.search(r'name="_xsrf" value="([^"]+)"', page).group(1)
        data = urllib.parse.urlencode({"username": user, "password": password, "_xsrf": xsrf}).encode()
        try:
            r = opener.open(hub.url + "/hub/login", data, timeout=120)
            return r.status, ""
        except urllib.error.HTTPError as e:
            return e.code, e.headers.get("Location", "")

    passwords = RESULTS["passwords"]
    assert set(passwords) == {INSTRUCTOR, *STUDENTS}, passwords
    status, location = log_in(STUDENTS[2], passwords[STUDENTS[2]])
    assert status == 302 and "/login" not in location, (status, location)
    status, location = log_in(STUDENTS[2], passwords[STUDENTS[2]] + "x")
    assert status == 403, (status, location)


def test_four_first_cells_at_once(hub):
    """Four students' servers start at once, lectures are in their homes, and their first lecture
    cells run at once from the warmed cache: no student compiles anything."""
    started = _start_servers(hub, STUDENTS)
    RESULTS["four_servers_ready_s"] = {u: round(t, 1) for u, t in started.items()}
    _start_servers(hub, [INSTRUCTOR])
    _only_loopback()
    lecture = hub.request("GET", f"/user/{STUDENTS[0]}/api/contents/lectures/{LECTURE}")["content"]
    cells = ["".join(c["source"]) for c in lecture["cells"] if c["cell_type"] == "code"][:2]
    out, threads = {}, []
    load = os.getloadavg()[0]
    for u in STUDENTS:
        threads.append(threading.Thread(target=_first_cells, args=(hub, u, cells, out)))
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert set(out) == set(STUDENTS), f"first cells failed for {set(STUDENTS) - set(out)}"
    RESULTS["four_first_cells_s"] = ({u: [round(x, 1) for x in v] for u, v in out.items()}, f"load {load:.1f}")
    for u in STUDENTS:
        home = pwd.getpwnam(u).pw_dir
        assert os.path.isfile(os.path.join(home, "lectures", LECTURE))
        assert pwd.getpwuid(os.stat(os.path.join(home, "lectures", LECTURE)).st_uid).pw_name == u
        compiled = glob.glob(os.path.join(home, ".cache", "numba", "**", "*.nbc"), recursive=True)
        assert not compiled, f"{u} compiled {compiled[:3]}"
    # nbgrader's instructor extensions: the instructor's only
    for u, code in [(STUDENTS[0], 404), (INSTRUCTOR, 200)]:
        status, _ = hub.request("GET", f"/user/{u}/formgrader", expect=None, raw=True)
        assert status == code, (u, status)
    for u, off in [(STUDENTS[0], True), (INSTRUCTOR, False)]:
        _, page = hub.request("GET", f"/user/{u}/lab", raw=True)
        config = json.loads(re.search(r'<script id="jupyter-config-data" type="application/json">(.*?)</script>',
                                      page, re.S).group(1))
        disabled = config["disabledExtensions"]
        if isinstance(disabled, dict):
            disabled = [k for k, v in disabled.items() if v]
        for ext in ("@jupyter/nbgrader:formgrader", "@jupyter/nbgrader:create-assignment"):
            assert (ext in disabled) == off, (u, ext, disabled)
    # the servers started without the warnings of item 3
    with open(os.path.join(PREFIX, "log", "jupyterhub.log")) as f:
        log = f.read()
    for warning in ("websocket_ping_timeout", "cannot be longer than", "extra_template_paths"):
        assert warning not in log, warning


def test_term(hub):
    """Release, fetch, answer, submit, a forgery refused at collect, autograde in the sandbox,
    grading by hand in the formgrader, feedback released and fetched."""
    ihome = pwd.getpwnam(INSTRUCTOR).pw_dir
    course = os.path.join(ihome, "course")
    for a in ASSIGNMENTS:
        as_user(INSTRUCTOR, f"cd ~/course && nbgrader generate_assignment {a} --force && "
                            f"nbgrader release_assignment {a} --force")

    plans = {}
    for a in ASSIGNMENTS:
        corpus = runpy.run_path(os.path.join(CORPUS, f"{a}.py"))
        correct = list(corpus["CORRECT"].values())
        mistake_name, (loses, mistake) = next(iter(corpus["MISTAKES"].items()))
        plans[a] = {STUDENTS[0]: ("right", correct[0], set()),
                    STUDENTS[1]: ("partly wrong: " + mistake_name, mistake, set(loses)),
                    STUDENTS[2]: ("empty", None, None),
                    STUDENTS[3]: ("right", correct[-1], set())}
    sources = {}
    for a in ASSIGNMENTS:
        with open(os.path.join(course, "source", a, f"{a}.ipynb")) as f:
            sources[a] = json.load(f)

    def student_works(u):
        for a in ASSIGNMENTS:
            as_user(u, f"nbgrader fetch_assignment {a}")
            path = f"/user/{u}/api/contents/{a}/{a}.ipynb"
            fetched = hub.request("GET", path)["content"]
            what, answers, _ = plans[a][u]
            if answers is not None:
                nb = _answered(fetched, sources[a], answers)
                hub.request("PUT", path, {"type": "notebook", "format": "json", "content": nb})
            as_user(u, f"nbgrader submit {a}")

    t0 = time.time()
    _in_parallel(student_works, STUDENTS)
    RESULTS["fetch_answer_submit_s"] = round(time.time() - t0, 1)

    # a forgery: gpc-ben puts an empty notebook in the exchange as gpc-ada's, later than hers
    inbound = os.path.join(EXCHANGE, "gpclab", "inbound")
    forged = f"{STUDENTS[0]}+{ASSIGNMENTS[0]}+2099-01-01 00:00:00.000000 UTC+forged000000"
    as_user(STUDENTS[1], f"mkdir '{inbound}/{forged}' && cp ~/{ASSIGNMENTS[0]}/{ASSIGNMENTS[0]}.ipynb "
                         f"'{inbound}/{forged}/' && date > '{inbound}/{forged}/timestamp.txt'")

    for a in ASSIGNMENTS:
        out = as_user(INSTRUCTOR, f"cd ~/course && nbgrader collect {a}")
        if a == ASSIGNMENTS[0]:
            assert "REFUSED" in out.stderr and forged in out.stderr, out.stderr
            RESULTS["forged_collect"] = [l for l in out.stderr.splitlines() if "REFUSED" in l]
        assert "cheating attempt" not in out.stderr
        for u in STUDENTS:
            assert os.path.isfile(os.path.join(course, "submitted", u, a, f"{a}.ipynb")), (u, a)
    # the instructor removes the refused submission (owned by its forger) without root's password
    out = as_user(INSTRUCTOR, f"sudo -n {PREFIX}/bin/remove-refused {ASSIGNMENTS[0]}")
    assert "removed" in out.stdout and not os.path.exists(os.path.join(inbound, forged)), out.stdout
    assert len(os.listdir(inbound)) == len(STUDENTS) * len(ASSIGNMENTS), os.listdir(inbound)

    from nbgrader.api import Gradebook     # reads the gradebook as root
    per_submission = {}
    for a in ASSIGNMENTS:
        t0 = time.time()
        load = os.getloadavg()[0]
        as_user(INSTRUCTOR, f"cd ~/course && nbgrader autograde {a}", timeout=1800)
        per_submission[a] = (round((time.time() - t0) / len(STUDENTS), 1), f"load {load:.1f}")
    RESULTS["autograde_per_submission_s"] = per_submission

    # grading by hand in the formgrader: every manual cell of every submission
    manual_graded = 0
    for a in ASSIGNMENTS:
        subs = hub.request("GET", f"/user/{INSTRUCTOR}/formgrader/api/submitted_notebooks/{a}/{a}")
        assert len(subs) == len(STUDENTS), subs
        for sub in subs:
            for g in hub.request("GET", f"/user/{INSTRUCTOR}/formgrader/api/grades?submission_id={sub['id']}"):
                if g["needs_manual_grade"] and g["auto_score"] is None:
                    score = MANUAL_SCORE if sub["student"] != STUDENTS[2] else 0.0
                    r = hub.request("PUT", f"/user/{INSTRUCTOR}/formgrader/api/grade/{g['id']}",
                                    {"manual_score": score})
                    assert r["manual_score"] == score
                    manual_graded += 1
    assert manual_graded > 0

    # the scores: from the source notebooks' points, never from the grader
    with Gradebook(f"sqlite:///{course}/gradebook.db") as gb:
        for a in ASSIGNMENTS:
            auto, manual = _points(sources[a])
            for u in STUDENTS:
                what, answers, loses = plans[a][u]
                grades = {g.name: g for g in gb.find_submission_notebook(a, a, u).grades}
                got = {k: grades[k].auto_score for k in auto}
                if answers is None:
                    want = {k: 0.0 for k in auto}
                else:
                    want = {k: (0.0 if k in loses else p) for k, p in auto.items()}
                # a mistake loses points in its own cells (possibly not all of them), nowhere else
                for k in auto:
                    if answers is not None and k in loses:
                        assert got[k] < auto[k], (a, u, what, k, got[k])
                    else:
                        assert got[k] == want[k], (a, u, what, k, got[k], want[k])
                for k in manual:
                    want_manual = 0.0 if answers is None else min(MANUAL_SCORE, manual[k])
                    assert grades[k].score == pytest.approx(min(want_manual, manual[k])), (a, u, k)

    for a in ASSIGNMENTS:
        as_user(INSTRUCTOR, f"cd ~/course && nbgrader generate_feedback {a} --force && "
                            f"nbgrader release_feedback {a}")
    _in_parallel(lambda u: [as_user(u, f"nbgrader fetch_feedback {a}") for a in ASSIGNMENTS], STUDENTS)
    for u in STUDENTS:
        for a in ASSIGNMENTS:
            html = glob.glob(os.path.join(pwd.getpwnam(u).pw_dir, a, "feedback", "*", f"{a}.html"))
            assert len(html) == 1, (u, a, html)
            with open(html[0]) as f:
                text = f.read()
            assert "Score:" in text and "BEGIN HIDDEN TESTS" not in text, (u, a)
    RESULTS["term_done"] = True


def test_access_attempts(hub):
    """What one student (gpc-ben) tries on another's (gpc-ada's) work and on the course, each
    refused by the system."""
    if not RESULTS.get("term_done"):
        pytest.skip("the term did not run to its end")
    ada, ben = STUDENTS[0], STUDENTS[1]
    ahome = pwd.getpwnam(ada).pw_dir
    ihome = pwd.getpwnam(INSTRUCTOR).pw_dir
    course = os.path.join(ihome, "course")
    a = ASSIGNMENTS[0]
    secret = glob.glob(os.path.join(ahome, ".local", "share", "jupyter", "nbgrader_cache", "gpclab",
                                    "**", "submission_secret.txt"), recursive=True)
    secret = secret[0] if secret else os.path.join(ahome, ".local")
    feedback = glob.glob(os.path.join(ahome, a, "feedback", "*", f"{a}.html"))[0]
    attempts = [
        ("another's home", f"ls {ahome}", ahome),
        ("another's answers", f"cat {ahome}/{a}/{a}.ipynb", f"{ahome}/{a}/{a}.ipynb"),
        ("another's submission in the exchange", f"ls '{EXCHANGE}/gpclab/inbound'", f"{EXCHANGE}/gpclab/inbound"),
        ("another's collected submission", f"cat {course}/submitted/{ada}/{a}/{a}.ipynb",
         f"{course}/submitted/{ada}/{a}/{a}.ipynb"),
        ("another's feedback in her home", f"cat '{feedback}'", feedback),
        ("the feedback in the exchange", f"ls '{EXCHANGE}/gpclab/feedback'", f"{EXCHANGE}/gpclab/feedback"),
        ("another's nbgrader secret", f"cat '{secret}'", secret),
        ("the gradebook", f"cat {course}/gradebook.db", f"{course}/gradebook.db"),
        ("the source notebooks", f"cat {course}/source/{a}/{a}.ipynb", f"{course}/source/{a}/{a}.ipynb"),
        ("the clone", f"ls {ROOT}/exercises/source", ROOT),
        ("a file in the course's outbound", f"touch '{EXCHANGE}/gpclab/outbound/{a}/planted'",
         f"{EXCHANGE}/gpclab/outbound/{a}"),
        ("replacing the course's exchange folder", f"mv '{EXCHANGE}/gpclab' '{EXCHANGE}/gone'",
         f"{EXCHANGE}/gpclab"),
        ("the instructor's removal command", f"sudo -n {PREFIX}/bin/remove-refused", f"{PREFIX}/bin/remove-refused"),
    ]
    for what, command, path in attempts:
        if what == "the instructor's removal command":
            out = as_user(ben, command, check=False)
            ok = out.returncode != 0 and ("password is required" in out.stderr or "not allowed" in out.stderr)
            RESULTS.setdefault("access", []).append((ben, command, "refused" if ok else "ALLOWED"))
            assert ok, out.stdout + out.stderr
            continue
        _denied(ben, command, path)
    # no released or public file holds a solution
    public = " ".join(f"'{p}'" for p in [os.path.join(PREFIX, d) for d in ("etc", "lib", "bin", "lectures")]
                      + [f"{EXCHANGE}/gpclab/outbound"])
    out = as_user(ben, f"grep -rl 'BEGIN SOLUTION\\|BEGIN HIDDEN TESTS' {public} 2>/dev/null; true")
    assert not out.stdout.strip(), out.stdout
    # a forged submission: refused at collect (test_term) and removed; gpc-ada's own was graded
    assert RESULTS.get("forged_collect")
    # the warnings the hub and the users' servers logged over the whole term (reported)
    with open(os.path.join(PREFIX, "log", "jupyterhub.log")) as f:
        RESULTS["log_warnings"] = sorted({re.sub(r"^\[W \S+ \S+ ", "[W ", line.strip())[:160]
                                          for line in f if line.startswith("[W ") and " log:" not in line})
