"""nbgrader's collect, taking only submissions that belong to the student they name.

The exchange's inbound folder is writable by every student, and a submission's name
(`<student>+<assignment>+<time>+<random>`) says whose it is. nbgrader's own collect only warns
"... claims to be submitted by alice but is owned by bob; cheating attempt?" and collects it (with
`--update`, over alice's real work). `CheckedCollect` (set as `c.ExchangeFactory.collect` in the
global nbgrader configuration that setup.sh writes) refuses a submission unless the folder and
every file in it belong to the student it names (or to root), and it contains no symbolic link;
a refused submission is reported and never collected, and the student's newest accepted
submission is collected instead. The copy itself follows no link either: an entry swapped for a
link (or a named pipe) after the check is left out and reported ("DROPPED ...").

A refused submission's files belong to the student who made it, so only root can delete them;
the instructor does it with `sudo <prefix>/bin/remove-refused ASSIGNMENT`, a wrapper that takes one
assignment name and nothing else, fixes the inbound folder and runs this file as a script; it
removes nothing but refused submissions.
"""
import argparse
import datetime
import glob
import os
import pwd
import re
import shutil
import stat
import sys


def _kind(mode):
    """What a file that is neither a regular file, a folder nor a symbolic link is."""
    for test, name in ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def refusal_reason(path, student):
    """Why the inbound entry `path`, named as submitted by `student`, is refused; None if it is
    accepted: the entry and everything in it owned by the student or root, no symbolic link, no
    special file (named pipe, socket, device: copying one would block or fail), and everything
    readable by others as `nbgrader submit` leaves it (files at least o+r, folders o+rx): an
    unreadable file would stop nbgrader's copy in the middle of the whole collect."""
    try:
        uid = pwd.getpwnam(student).pw_uid
    except KeyError:
        uid = None
    allowed = {0} if uid is None else {0, uid}

    def owner(st):
        try:
            return pwd.getpwuid(st.st_uid).pw_name
        except KeyError:
            return f"uid {st.st_uid}"

    def check(p, st, what):
        if stat.S_ISLNK(st.st_mode):
            return f"{what} is a symbolic link"
        if st.st_uid not in allowed:
            return f"{what} belongs to {owner(st)}"
        if stat.S_ISDIR(st.st_mode):
            if st.st_mode & (stat.S_IROTH | stat.S_IXOTH) != (stat.S_IROTH | stat.S_IXOTH):
                return f"{what} is a folder others cannot read (mode {stat.S_IMODE(st.st_mode):o})"
        elif stat.S_ISREG(st.st_mode):
            if not st.st_mode & stat.S_IROTH:
                return f"{what} is a file others cannot read (mode {stat.S_IMODE(st.st_mode):o})"
        else:
            return f"{what} is {_kind(st.st_mode)}"
        return None

    try:
        st = os.lstat(path)
    except OSError as e:
        return f"it cannot be inspected ({e.strerror})"
    reason = check(path, st, "it")
    if reason is not None:
        return reason
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a folder"
    errors = []
    for folder, dirs, files in os.walk(path, onerror=errors.append):
        for name in dirs + files:
            p = os.path.join(folder, name)
            try:
                st = os.lstat(p)
            except OSError as e:
                return f"{os.path.relpath(p, path)} cannot be inspected ({e.strerror})"
            reason = check(p, st, os.path.relpath(p, path))
            if reason is not None:
                return reason
    if errors:
        e = errors[0]
        where = os.path.relpath(e.filename, path) if getattr(e, "filename", None) else "a folder"
        return f"{where} cannot be read ({e.strerror})"
    return None


def _copy_regular(src, dst):
    """Copy the regular file `src` (opened without following a link, or refused) to `dst`, with its
    mode and times, as shutil.copy2 would."""
    fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{src}: not a regular file")
        with os.fdopen(os.dup(fd), "rb") as inp, open(dst, "wb") as out:
            shutil.copyfileobj(inp, out)
        os.chmod(dst, stat.S_IMODE(st.st_mode))
        os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
    finally:
        os.close(fd)
    return dst


# installed as <prefix>/lib/gpclab_checked_exchange.py; the command is <prefix>/bin/remove-refused
REMOVE_COMMAND = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bin",
                              "remove-refused")


def _student_of(entry):
    return os.path.basename(entry).rsplit("+", 3)[0]


try:
    from nbgrader.exchange.default.collect import ExchangeCollect
except ImportError:     # the removal script runs without nbgrader's imports
    ExchangeCollect = object


class CheckedCollect(ExchangeCollect):
    """nbgrader's ExchangeCollect that refuses (reports, never collects) submissions whose files
    do not belong to the student they name."""

    _OLDEST = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)

    def _path_to_record(self, path):
        record = super()._path_to_record(path)
        reason = refusal_reason(path, record["username"])
        if reason is not None:
            record["refused"] = reason
            record["timestamp"] = self._OLDEST       # never the newest while another is accepted
            self._refused.append(record)
        return record

    def _sort_by_timestamp(self, records):
        accepted = [r for r in records if "refused" not in r]
        return super()._sort_by_timestamp(accepted or records)

    def init_src(self):
        self._refused = []
        super().init_src()

    def do_copy(self, src, dest, log=None):
        """nbgrader's copy of one accepted submission, following no link: the student owns the
        inbound folder and may swap a checked file for a symbolic link (or a named pipe) before
        the copy; such an entry is left out and reported, and a regular file is opened without
        following a link."""
        dropped = []
        real_copytree = shutil.copytree

        def copytree(s, d, *args, **kw):
            if kw.get("copy_function") is _copy_regular or (len(args) > 2 and args[2] is _copy_regular):
                return real_copytree(s, d, *args, **kw)          # copytree's own call for a subfolder
            ignore = kw.get("ignore")

            def ignore_special(folder, names):
                out = set(ignore(folder, names)) if ignore else set()
                for n in names:
                    try:
                        mode = os.lstat(os.path.join(folder, n)).st_mode
                    except OSError:
                        mode = 0
                    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                        out.add(n)
                        dropped.append(os.path.relpath(os.path.join(folder, n), src))
                return out
            return real_copytree(s, d, ignore=ignore_special, symlinks=True, copy_function=_copy_regular)

        shutil.copytree = copytree
        try:
            super().do_copy(src, dest, log)
        finally:
            shutil.copytree = real_copytree
        for folder, dirs, files in os.walk(dest):        # anything that still is a link goes
            for name in dirs + files:
                p = os.path.join(folder, name)
                if os.path.islink(p):
                    os.unlink(p)
                    dropped.append(os.path.relpath(p, dest))
        for name in sorted(set(dropped)):
            self.log.error("DROPPED %s from %s: a symbolic link or special file; not collected", name, src)

    def copy_files(self):
        for rec in self._refused:
            self.log.error(
                "REFUSED %s: named as %s's submission, but %s; not collected. Remove it with: "
                "sudo %s %s",
                os.path.join(self.inbound_path, rec["filename"]), rec["username"], rec["refused"],
                REMOVE_COMMAND, self.coursedir.assignment_id)
        self.src_records = [r for r in self.src_records if "refused" not in r]
        super().copy_files()


ASSIGNMENT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="remove-refused",
        description="Remove the submissions in the exchange's inbound folder that collect refuses "
                    "(files that do not belong to the student the submission names).")
    parser.add_argument("--inbound", required=True, help=argparse.SUPPRESS)
    parser.add_argument("assignments", nargs="*", metavar="ASSIGNMENT",
                        help="only submissions of these assignments (default: all)")
    args = parser.parse_args(argv)
    for a in args.assignments:
        if not ASSIGNMENT_NAME.fullmatch(a):
            parser.error(f"not an assignment name: {a!r} (letters, digits, _ . -; not starting "
                         "with a dot or a dash)")
    names = args.assignments or ["*"]
    removed = 0
    for a in names:
        for entry in sorted(glob.glob(os.path.join(args.inbound, f"*+{a}+*"))):
            reason = refusal_reason(entry, _student_of(entry))
            if reason is None:
                continue
            if os.path.islink(entry) or not os.path.isdir(entry):
                os.unlink(entry)
            else:
                shutil.rmtree(entry)
            print(f"removed {os.path.basename(entry)} ({reason})")
            removed += 1
    print(f"{removed} refused submission(s) removed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
