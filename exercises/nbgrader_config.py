"""nbgrader course for gpclab: GPML chapter 3 exercises 3.10.1-6, autograded."""
c = get_config()  # noqa: F821  (provided by nbgrader)

c.CourseDirectory.course_id = "gpclab"
c.CourseDirectory.root = "."
# numba compiles gpclab on first use in a fresh environment: allow for it per cell
c.Execute.timeout = 600
c.Execute.kernel_name = "python3"
