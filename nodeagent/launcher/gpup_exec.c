/* gpup-exec: what a task's process does between its supervisor's fork and the command's exec.

   usage: gpup-exec [-n TMP_SIZE [-k DIR]] UID GID WORKDIR NCGROUPS [CGROUP_PROCS_FILE ...]
                    PROGRAM [ARG ...]

   In order: join the attempt's cgroups (write "0" to each cgroup.procs, while still root), become
   UID:GID with no supplementary groups ("-" for both: stay who we are, single-user mode), set the
   umask to 077, make WORKDIR (and its parents) as that user and enter it, then exec PROGRAM with
   the environment we were given. A failure is written to standard error and we exit 126, as a
   shell does for a command it cannot run.

   With -n (root only), the task gets PID and mount namespaces of its own, after the cgroups are
   joined: mounts are made private, /proc is mounted afresh (ps shows the task's processes
   alone), and /tmp and /dev/shm are new tmpfs of TMP_SIZE bytes (their pages count to the
   attempt's memory cgroup; gone with the namespace). -k DIR: a directory under /tmp (the
   tenant's root, where the platform keeps its tasks there) bound back in place over the new
   /tmp. This process stays outside, as the one the supervisor waits for; its child is the
   namespace's init (PID 1: the kernel drops signals it has no handler for, and killing it kills
   the namespace), which becomes UID:GID too and runs the command as its child (see ns_init).

   Why a program and not Python's preexec_fn: a preexec_fn makes subprocess fork the supervisor
   (a copy of its whole address space, torn down again by the exec) and run Python in the copy.
   Measured on 2 cores under load, that fork and teardown were about a third of a supervisor's
   CPU; with this program the supervisor spawns with vfork (nothing copied) and this static binary
   does the rest in a few system calls. See supervisor.py (``exec_helper``). */

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* The value the outer process sends its forwarded signals with (sigqueue), so that the init
   can tell them from the supervisor's own, which reach every process of the attempt already. */
#define FORWARDED 0x67707570

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
static void make_dirs(char *path, mode_t mode, const char *what)
{
    if (mkdir(path, mode) == 0 || errno == EEXIST)
        return;
    char *slash = strrchr(path, '/');
    if (errno != ENOENT || slash == NULL || slash == path)
        fail(what, path);
    *slash = '\0';
    make_dirs(path, mode, what);
    *slash = '/';
    if (mkdir(path, mode) != 0 && errno != EEXIST)
        fail(what, path);
}

static void become(const char *uid_text, const char *gid_text)
{
    if (strcmp(uid_text, "-") == 0)
        return;
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

/* Every signal but those a fault raises in this very process (and SIGKILL, SIGSTOP). */
/* The last step, as the task's user: umask 077, make WORKDIR and enter it, exec PROGRAM. */
static void run(char *workdir, char **program)
{
    umask(077);
    make_dirs(workdir, 0777, "cannot make the work directory");
    if (chdir(workdir) != 0)
        fail("cannot enter the work directory", workdir);
    execv(program[0], program);
    fail("cannot run", program[0]);
}

static void catchable(sigset_t *set)
{
    sigfillset(set);
    int faults[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP, SIGSYS, SIGABRT};
    for (size_t i = 0; i < sizeof faults / sizeof *faults; i++)
        sigdelset(set, faults[i]);
}

/* End as the command ended: its exit code, or killed by the same signal (no core of ours). */
static void end_as(int status)
{
    if (WIFEXITED(status))
        _exit(WEXITSTATUS(status));
    if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        struct rlimit none = {0, 0};
        setrlimit(RLIMIT_CORE, &none);
        prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
        signal(sig, SIG_DFL);
        sigset_t one;
        sigemptyset(&one);
        sigaddset(&one, sig);
        sigprocmask(SIG_UNBLOCK, &one, NULL);
        kill(getpid(), sig);
        _exit(128 + sig);
    }
    _exit(126);
}

/* The namespace's PID 1, as UID:GID: run the command as a child in a session of its own (as
   the supervisor's start_new_session made it before), pass on the signals sent to us from
   inside the namespace or forwarded by the outer process, reap every orphan, and tell the
   outer process the command's wait status as soon as it ends (with whether others are left,
   which the supervisor then stops as it stops any leftovers: SIGTERM, grace, kill). Signals
   from outside that were not forwarded (si_pid 0) are the supervisor's: it sends them to every
   process of the attempt, the command included, so passing them on would deliver them twice. */
static void ns_init(int report, char **program, char *workdir, const char *uid_text,
                    const char *gid_text)
{
    become(uid_text, gid_text);
    prctl(PR_SET_NAME, "gpup-init", 0, 0, 0);
    pid_t command = fork();
    if (command < 0)
        fail("cannot start the command", program[0]);
    if (command == 0) {
        close(report);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        setsid();
        run(workdir, program);
    }
    sigset_t all;
    catchable(&all);
    int told = 0;
    for (;;) {
        siginfo_t info;
        int sig = sigwaitinfo(&all, &info);
        if (sig < 0)
            continue;
        if (sig != SIGCHLD) {
            int forwarded = info.si_code == SI_QUEUE && info.si_value.sival_int == FORWARDED;
            if (!told && (info.si_pid != 0 || forwarded))
                kill(command, sig);
            continue;
        }
        int status;
        pid_t pid;
        while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
            if (pid == command && !told) {
                siginfo_t other;
                int message[2] = {status, waitid(P_ALL, 0, &other, WEXITED | WNOHANG | WNOWAIT) == 0};
                told = 1;
                if (write(report, message, sizeof message) != sizeof message)
                    dprintf(2, "gpuplatform: the task's launcher is gone: %s\n", strerror(errno));
                close(report);
            }
        }
        if (told && pid < 0 && errno == ECHILD)
            _exit(0);
    }
}

/* Outside the namespace: the process the supervisor started and waits for. It forwards what
   is sent to it alone (not the supervisor's own signals: those reach everyone) and ends as the
   command did, once the init tells it how. */
static void outer(pid_t init, int report)
{
    sigset_t all;
    catchable(&all);
    int signals = signalfd(-1, &all, SFD_CLOEXEC);
    pid_t supervisor = getppid();
    struct pollfd watch[2] = {{.fd = report, .events = POLLIN}, {.fd = signals, .events = POLLIN}};
    for (;;) {
        if (poll(watch, signals < 0 ? 1 : 2, -1) < 0)
            continue;
        if (signals >= 0 && (watch[1].revents & POLLIN)) {
            struct signalfd_siginfo got;
            if (read(signals, &got, sizeof got) == sizeof got && got.ssi_signo != SIGCHLD &&
                (pid_t)got.ssi_pid != supervisor) {
                union sigval value = {.sival_int = FORWARDED};
                sigqueue(init, (int)got.ssi_signo, value);
            }
        }
        if (watch[0].revents) {
            int message[2], status;
            ssize_t got = read(report, message, sizeof message);
            if (got == sizeof message) {
                if (!message[1])
                    waitpid(init, NULL, 0);  /* it is ending: gone before we are */
                end_as(message[0]);
            }
            /* no word from the init: it could not prepare the task, or was killed */
            while (waitpid(init, &status, 0) < 0 && errno == EINTR)
                ;
            end_as(status);
        }
    }
}

static void mount_or_fail(const char *source, const char *target, const char *type,
                          unsigned long flags, const char *options)
{
    if (mount(source, target, type, flags, options) != 0)
        fail("cannot mount", target);
}

/* In the new mount namespace, as root: nothing we mount reaches the host, and the host's
   later mounts reach us no more either. */
static void private_mounts(const char *size, const char *keep)
{
    char options[64];
    int keep_fd = -1;
    umask(022);  /* the directories above a kept one: crossable by the tenant's user */
    if (keep != NULL && (keep_fd = open(keep, O_PATH | O_DIRECTORY | O_CLOEXEC)) < 0)
        fail("cannot open", keep);
    mount_or_fail("none", "/", NULL, MS_REC | MS_PRIVATE, NULL);
    mount_or_fail("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
    snprintf(options, sizeof options, "mode=1777,size=%s", size);
    mount_or_fail("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, options);
    struct stat shm;
    if (stat("/dev/shm", &shm) == 0 && S_ISDIR(shm.st_mode))
        mount_or_fail("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, options);
    if (keep_fd >= 0) {
        char path[4096], from[64];
        if (snprintf(path, sizeof path, "%s", keep) >= (int)sizeof path) {
            errno = ENAMETOOLONG;
            fail("cannot keep", keep);
        }
        make_dirs(path, 0711, "cannot make the directory");
        snprintf(from, sizeof from, "/proc/self/fd/%d", keep_fd);
        mount_or_fail(from, path, NULL, MS_BIND | MS_REC, NULL);
        close(keep_fd);
    }
}

int main(int argc, char **argv)
{
    const char *tmp_size = NULL, *keep = NULL;
    while (argc > 2 && argv[1][0] == '-' && argv[1][1] && !argv[1][2] && strchr("nk", argv[1][1])) {
        if (argv[1][1] == 'n')
            tmp_size = argv[2];
        else
            keep = argv[2];
        argv += 2;
        argc -= 2;
    }
    if (argc < 6) {
        dprintf(2, "usage: gpup-exec [-n TMP_SIZE [-k DIR]] UID GID WORKDIR NCGROUPS "
                   "[CGROUP_PROCS ...] PROGRAM [ARG ...]\n");
        return 126;
    }
    const char *uid_text = argv[1], *gid_text = argv[2];
    char *workdir = argv[3];
    long groups = number(argv[4], "bad cgroup count");
    if (groups > argc - 6) {
        errno = EINVAL;
        fail("bad cgroup count", argv[4]);
    }
    if (tmp_size != NULL)
        number(tmp_size, "bad tmp size");
    char **program = argv + 5 + groups;

    for (long i = 0; i < groups; i++) {  /* v2 first (the caller's order): tracked from now on */
        const char *procs = argv[5 + i];
        int fd = open(procs, O_WRONLY | O_CLOEXEC);
        if (fd < 0 || write(fd, "0", 1) != 1)
            fail("cannot join the attempt's cgroup", procs);
        close(fd);
    }
    if (tmp_size != NULL) {
        /* Blocked before the fork, so the init has every signal queued for sigwaitinfo from
           its first instruction (a PID 1 would drop them unhandled). */
        sigset_t all;
        catchable(&all);
        sigprocmask(SIG_BLOCK, &all, NULL);
        int pipe_fds[2];
        if (pipe2(pipe_fds, O_CLOEXEC) != 0)
            fail("cannot make a pipe", "");
        if (unshare(CLONE_NEWPID | CLONE_NEWNS) != 0)
            fail("cannot make the task's namespaces", "(PID, mount)");
        pid_t init = fork();
        if (init < 0)
            fail("cannot start the namespace's init", "");
        if (init > 0) {
            close(pipe_fds[1]);
            outer(init, pipe_fds[0]);
        }
        close(pipe_fds[0]);
        private_mounts(tmp_size, keep);
        ns_init(pipe_fds[1], program, workdir, uid_text, gid_text);
    }
    become(uid_text, gid_text);
    run(workdir, program);
}
