"""jupyterhub-singleuser for the course hub (the spawner's command: python -m gpclab_course_singleuser).

JupyterHub's single-user extension, without its setting for the classic notebook: it adds its
templates (a "Control Panel" button for notebook < 7's pages) as NotebookApp.extra_template_paths,
and JupyterLab's and Notebook 7's configuration shim reports that at every server start ("
'extra_template_paths' was found in both NotebookApp and ServerApp"). The course venv has no
classic notebook (Notebook 7 and JupyterLab have their own pages and their own hub menu), so the
setting is dropped; everything else is JupyterHub's extension as it is.
"""
from jupyterhub.singleuser.extension import JupyterHubSingleUser


class CourseSingleUser(JupyterHubSingleUser):

    def load_config_file(self):
        super().load_config_file()
        notebook_app = self.config.get("NotebookApp")
        if notebook_app is not None and "extra_template_paths" in notebook_app:
            del notebook_app["extra_template_paths"]


def _jupyter_server_extension_points():
    return [{"module": "gpclab_course_singleuser", "app": CourseSingleUser}]


main = CourseSingleUser.launch_instance

if __name__ == "__main__":
    # run the class of the importable module (not of __main__), which Jupyter Server finds by name
    from gpclab_course_singleuser import main as _main
    _main()
