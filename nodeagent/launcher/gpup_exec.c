/* gpup-exec: what a task's process does between its supervisor's fork and the command's exec.

   usage: gpup-exec UID GID WORKDIR NCGROUPS [CGROUP_PROCS_FILE ...] PROGRAM [ARG ...]

   In order: join the attempt's cgroups (write "0" to each cgroup.procs, while still root), become
   UID:GID with no supplementary groups ("-" for both: stay who we are, single-user mode), set the
   umask to 077, make WORKDIR (and its parents) as that user and enter it, then exec PROGRAM with
   the environment we were given. A failure is written to standard error and we exit 126, as a
   shell does for a command it cannot run.

   Why a program and not Python's preexec_fn: a preexec_fn makes subprocess fork the supervisor
   (a copy of its whole address space, torn down again by the exec) and run Python in the copy.
   Measured on 2 cores under load, that fork and teardown were about a third of a supervisor's
   CPU; with this program the supervisor spawns with vfork (nothing copied) and this static binary
   does the rest in a few system calls. See supervisor.py (``exec_helper``). */

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void fail(const char *what, const char *path)
{
    dprintf(2, "gpuplatform: cannot prepare the task: %s %s: %s\n", what, path, strerror(errno));
    _exit(126);
}

static long number(const char *text, const char *what)
{
    char *end;
    errno = 0;
    long value = strtol(text, &end, 10);
    if (errno || *end || end == text || value < 0) {
        errno = EINVAL;
        fail(what, text);
    }
    return value;
}

/* mkdir -p, as whoever we are now, the way Python's os.makedirs goes about it: the directory
   itself first (it usually exists: one call), its parents only when they are missing. */
static void make_dirs(char *path)
{
    if (mkdir(path, 0777) == 0 || errno == EEXIST)
        return;
    char *slash = strrchr(path, '/');
    if (errno != ENOENT || slash == NULL || slash == path)
        fail("cannot make the work directory", path);
    *slash = '\0';
    make_dirs(path);
    *slash = '/';
    if (mkdir(path, 0777) != 0 && errno != EEXIST)
        fail("cannot make the work directory", path);
}

int main(int argc, char **argv)
{
    if (argc < 6) {
        dprintf(2, "usage: gpup-exec UID GID WORKDIR NCGROUPS [CGROUP_PROCS ...] PROGRAM [ARG ...]\n");
        return 126;
    }
    const char *uid_text = argv[1], *gid_text = argv[2];
    char *workdir = argv[3];
    long groups = number(argv[4], "bad cgroup count");
    if (groups > argc - 6) {
        errno = EINVAL;
        fail("bad cgroup count", argv[4]);
    }
    char **program = argv + 5 + groups;

    for (long i = 0; i < groups; i++) {  /* v2 first (the caller's order): tracked from now on */
        const char *procs = argv[5 + i];
        int fd = open(procs, O_WRONLY | O_CLOEXEC);
        if (fd < 0 || write(fd, "0", 1) != 1)
            fail("cannot join the attempt's cgroup", procs);
        close(fd);
    }
    if (strcmp(uid_text, "-") != 0) {
        uid_t uid = (uid_t)number(uid_text, "bad user id");
        gid_t gid = (gid_t)number(gid_text, "bad group id");
        if (setgroups(0, NULL) != 0)
            fail("cannot drop the supplementary groups", "");
        if (setgid(gid) != 0)
            fail("cannot become group", gid_text);
        if (setuid(uid) != 0)
            fail("cannot become user", uid_text);
        if (uid != 0 && setuid(0) == 0) {  /* never: setuid as root drops all three ids */
            errno = EPERM;
            fail("could regain root after becoming", uid_text);
        }
    }
    umask(077);
    make_dirs(workdir);
    if (chdir(workdir) != 0)
        fail("cannot enter the work directory", workdir);
    execv(program[0], program);
    fail("cannot run", program[0]);
    return 126;
}
