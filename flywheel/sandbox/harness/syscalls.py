"""The candidate's seccomp filter (stdlib and libseccomp's binding only: it runs in the sandbox).

Imported by candidate.py from /harness, and by the host's tests for the list it denies.
"""

import errno

# CLONE_NEWUSER, NEWNS, NEWPID, NEWIPC, NEWUTS, NEWNET, NEWCGROUP
NAMESPACE_FLAGS = (
    0x10000000,
    0x00020000,
    0x20000000,
    0x08000000,
    0x04000000,
    0x40000000,
    0x02000000,
)

# Denied with EPERM: kernel interfaces a Python test never needs, the usual starting points of
# kernel escalations, and every way to a new namespace. A denied call fails; nothing is killed.
DENIED_SYSCALLS = (
    "io_uring_setup", "io_uring_enter", "io_uring_register", "bpf", "perf_event_open",
    "userfaultfd", "keyctl", "add_key", "request_key", "kexec_load", "kexec_file_load",
    "init_module", "finit_module", "delete_module", "mount", "umount2", "pivot_root", "chroot",
    "mount_setattr", "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount", "fspick",
    "unshare", "setns", "ptrace", "process_vm_readv", "process_vm_writev", "kcmp",
    "pidfd_getfd", "open_by_handle_at", "name_to_handle_at", "swapon", "swapoff", "reboot",
    "acct", "quotactl", "quotactl_fd", "syslog", "vhangup", "settimeofday", "clock_settime",
    "clock_adjtime", "adjtimex", "lookup_dcookie", "uselib", "fanotify_init", "iopl",
    "ioperm", "modify_ldt", "mbind", "migrate_pages", "move_pages", "set_mempolicy",
    "sethostname", "setdomainname", "memfd_secret",
)  # fmt: skip


def build_filter():
    """The seccomp filter every candidate process runs under, built once per zygote.

    clone is allowed only without namespace flags; clone3, whose flags sit behind a pointer
    the filter cannot read, answers ENOSYS so that libc falls back to clone.
    """
    import seccomp  # the system's libseccomp binding, bound into /harness by the host

    denied = seccomp.SyscallFilter(seccomp.ALLOW)
    for name in DENIED_SYSCALLS:
        denied.add_rule(seccomp.ERRNO(errno.EPERM), name)
    for flag in NAMESPACE_FLAGS:
        denied.add_rule(
            seccomp.ERRNO(errno.EPERM), "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag)
        )
    denied.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    return denied
