"""nbgrader course for gpclab: GPML chapter 3 exercises 3.10.1-6.

Run nbgrader from this folder (or with --course-dir); see the README's exercises section.
"""
import copy
import os
import sys
import warnings

from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor
from nbgrader import utils
from nbgrader.api import MissingEntry
from nbgrader.converters import Autograde
from nbgrader.preprocessors import (CheckCellMetadata, ClearHiddenTests, ClearOutput, DeduplicateIds,
                                    Execute, GetGrades, OverwriteCells, OverwriteKernelspec)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from grading_sandbox import (InertCells, SandboxedExecute, SealedFeedback, autograde_without_links,  # noqa: E402
                             feedback_without_files)  # (next to this file)

c = get_config()  # noqa: F821  (provided by nbgrader)

c.CourseDirectory.course_id = "gpclab"
# an absolute root: a relative one makes every command warn "root '.' is not absolute"
c.CourseDirectory.root = os.path.dirname(os.path.abspath(__file__))
# Bounds of a graded notebook (grading_sandbox.py): a cell that runs longer than Execute.timeout
# seconds is stopped and scores 0 (a warm numba cache, `gpclab compile`, keeps every cell of a
# correct answer to a few seconds); all cells together get SandboxedExecute.submission_timeout
# seconds; each sandbox (a kernel and every process it starts) may use
# SandboxedKernelManager.memory_limit_gib of memory and run tasks_limit processes and threads (a
# control group per sandbox where the grader can make one, else per-process limits); its /tmp,
# HOME and working folder are tmpfs of tmp_size_mib / work_size_mib, no file it writes may exceed
# file_size_mib, and a cell keeps SandboxedExecute.cell_output_mib of output, a notebook
# notebook_output_mib (see the README's "Bounds" table).
c.Execute.timeout = 60
c.SandboxedExecute.submission_timeout = 300
c.SandboxedKernelManager.memory_limit_gib = 2.0
c.SandboxedKernelManager.tasks_limit = 64
c.SandboxedKernelManager.tmp_size_mib = 256
c.SandboxedKernelManager.work_size_mib = 256
c.SandboxedKernelManager.file_size_mib = 64
c.SandboxedExecute.cell_output_mib = 1.0
c.SandboxedExecute.notebook_output_mib = 10.0
c.Execute.kernel_name = "python3"
# nbgrader 0.9 with SQLAlchemy 2 warns "Object of type <Submitted...> not in session" while it
# records a submission; the gradebook is written correctly, so the warning is only noise
warnings.filterwarnings("ignore", message=r"Object of type <Submitted", module=r"nbgrader\.")


class RestoreHiddenTestsQuietly(OverwriteCells):
    """Autograde restores every locked cell from the source. A test cell that differs from the
    source only by its hidden tests (as released) is restored without the "Attribute 'checksum'
    has changed" warning that nbgrader prints for tampered cells; any other change still warns."""

    def preprocess_cell(self, cell, resources, cell_index):
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id is not None and cell.cell_type == "code" and utils.is_grade(cell):
            try:
                source = self.gradebook.find_source_cell(grade_id, self.notebook_id, self.assignment_id)
            except MissingEntry:
                source = None
            if source is not None and source.locked and cell.source != source.source:
                released = copy.deepcopy(cell)
                released.source = source.source
                ClearHiddenTests(enforce_metadata=False)._remove_hidden_test_region(released)
                if released.source.rstrip() == cell.source.rstrip():
                    cell.source = source.source
        return super().preprocess_cell(cell, resources, cell_index)


# Autograde copies into autograded/ (and so into the sandbox) only the regular files of a submission:
# symbolic links (to the source notebook, the gradebook, another student's folder), files in linked
# folders and special files are left out, with a warning naming them ("symlinks refused: ...").
autograde_without_links()

c.Autograde.sanitize_preprocessors = [ClearOutput, DeduplicateIds, OverwriteKernelspec,
                                      RestoreHiddenTestsQuietly, CheckCellMetadata, InertCells]
# Feedback is composed by the grader (grading_sandbox.SealedFeedback): each test cell shows one line
# (passed / failed / stopped, the part, its points and, on failure, the error's type and the
# instructor's message when it is one of the notebook's own message texts), never its outputs;
# outputs of the other cells that ran after the first hidden test are left out; and
# generate_feedback writes only the HTML and submitted/'s timestamp.txt and submission_secret.txt
# (nbgrader would copy every file of the autograded folder, files written by student code included).
c.GenerateFeedback.preprocessors = [GetGrades, SealedFeedback, CSSHTMLHeaderPreprocessor]
feedback_without_files()

# Student code runs in a sandbox (grading_sandbox.py): each submission's kernel under bubblewrap
# sees the system and Python read-only, writes only in its own autograded/<student>/<assignment>/
# folder, and cannot see the course (source/, submitted/, gradebook.db), the exchange or any home
# folder. Without bubblewrap autograde refuses; to grade unsandboxed anyway (only where grading
# is isolated otherwise, e.g. one container per submission), uncomment:
# c.SandboxedKernelManager.allow_unsandboxed = True
c.Autograde.autograde_preprocessors = [
    SandboxedExecute if pp is Execute else pp
    for pp in Autograde.class_traits()["autograde_preprocessors"].default()]

# `nbgrader zip_collect <assignment>`: a learning platform's download (zip files or notebooks) in
# downloaded/<assignment>/archive/, one file per student named <student id>_<notebook>.ipynb.
# nbgrader matches the pattern against the whole path, hence the leading ".*/". Adapt it to the
# names your platform gives (see nbgrader's documentation on zip_collect).
c.FileNameCollectorPlugin.named_regexp = r".*/(?P<student_id>[^/]+?)_(?P<file_id>ex3_10_[1-6]\.ipynb)$"
