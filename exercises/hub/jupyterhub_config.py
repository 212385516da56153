"""JupyterHub configuration of the gpclab course hub (installed by setup.sh as
<prefix>/etc/jupyterhub_config.py, next to course.env, which holds the instructor, the ports and
the exchange).

PAM log-in with the machine's Unix users (members of the course's two groups), one
jupyterhub-singleuser server per user from the course venv, run as that user in their home;
everything listens on 127.0.0.1 only (put a TLS reverse proxy in front to serve a network).
"""
import grp
import os
import pwd
import subprocess

c = get_config()  # noqa: F821  (provided by JupyterHub)

ETC = os.path.dirname(os.path.abspath(__file__))
PREFIX = os.path.dirname(ETC)
VENV = os.path.join(PREFIX, "venv")
STATE = os.path.join(PREFIX, "state")
LECTURES = os.path.join(PREFIX, "lectures")


def _settings(path):
    values = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#") and "=" in line:
                key, value = line.split("=", 1)
                values[key] = value
    return values


S = _settings(os.path.join(ETC, "course.env"))
PORT, HUB_PORT, PROXY_API_PORT = int(S["PORT"]), int(S["HUB_PORT"]), int(S["PROXY_API_PORT"])

# ---- network: 127.0.0.1 only -----------------------------------------------------------------
c.JupyterHub.bind_url = f"http://127.0.0.1:{PORT}"
c.JupyterHub.hub_bind_url = f"http://127.0.0.1:{HUB_PORT}"
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{PROXY_API_PORT}"
c.ConfigurableHTTPProxy.command = [os.path.join(PREFIX, "node", "node_modules", ".bin",
                                                "configurable-http-proxy")]
c.Spawner.ip = "127.0.0.1"

# ---- state, root only --------------------------------------------------------------------------
c.JupyterHub.cookie_secret_file = os.path.join(STATE, "jupyterhub_cookie_secret")
c.JupyterHub.db_url = "sqlite:///" + os.path.join(STATE, "jupyterhub.sqlite")
c.JupyterHub.pid_file = os.path.join(STATE, "jupyterhub.pid")      # setup.sh start/stop use it

# ---- who may log in -------------------------------------------------------------------------------
c.JupyterHub.authenticator_class = "pam"
c.PAMAuthenticator.allowed_groups = {S["STUDENTS_GROUP"], S["INSTRUCTORS_GROUP"]}
# a token with the hub's admin role for root's scripts (setup.sh status, tests): root-only file
with open(os.path.join(STATE, "admin_token")) as f:
    _admin_token = f.read().strip()
c.JupyterHub.services = [{"name": "course-admin", "api_token": _admin_token}]
c.JupyterHub.load_roles = [{"name": "admin", "services": ["course-admin"]}]

# ---- each user's server ---------------------------------------------------------------------------
# jupyterhub-singleuser, without the classic notebook's template setting that JupyterLab warns
# about at every start (<prefix>/lib/gpclab_course_singleuser.py)
c.Spawner.cmd = [os.path.join(VENV, "bin", "python"), "-m", "gpclab_course_singleuser"]
c.Spawner.default_url = "/lab"
# a loaded machine (four servers starting at once on two cores took up to 15 s; a cold start
# after boot more): wait longer than JupyterHub's defaults before giving up
c.Spawner.start_timeout = 180
c.Spawner.http_timeout = 120
# of the hub's own environment, users get only these (JupyterHub's default also passes PYTHONPATH
# and conda's variables on)
c.Spawner.env_keep = ["LANG", "LC_ALL", "TZ"]
c.Spawner.environment = {
    # the course venv first (terminals are login shells: /etc/profile.d/gpclab-course.sh)
    "PATH": f"{VENV}/bin:/usr/local/bin:/usr/bin:/bin",
}


def _members(group):
    try:
        g = grp.getgrnam(group)
    except KeyError:
        return set()
    return set(g.gr_mem) | {p.pw_name for p in pwd.getpwall() if p.pw_gid == g.gr_gid}


def pre_spawn_hook(spawner):
    """Before each start of a user's server: their home private (0700), and, at the first start,
    the lectures copied into ~/lectures (by the user, so nothing in the home is followed as root)."""
    name = spawner.user.name
    user = pwd.getpwnam(name)
    home = user.pw_dir
    if not os.path.isdir(home):
        raise RuntimeError(f"{name} has no home folder {home}")
    st = os.lstat(home)
    if st.st_uid == user.pw_uid and (st.st_mode & 0o777) != 0o700:
        os.chmod(home, 0o700)
    target = os.path.join(home, "lectures")
    if not os.path.lexists(target) and os.path.isdir(LECTURES):
        subprocess.run(["/usr/sbin/runuser", "-u", name, "--", "cp", "-r", "--no-preserve=mode,ownership",
                        LECTURES, target], check=True, cwd="/")


c.Spawner.pre_spawn_hook = pre_spawn_hook
