/* noxstate PROGRAM ARGS...: runs PROGRAM with ptrace(PTRACE_GETREGSET or PTRACE_SETREGSET,
 * NT_X86_XSTATE) failing with EIO (a seccomp filter), so that user-mode Linux keeps its guests'
 * FPU state with PTRACE_GETFPREGS/SETFPREGS instead.
 *
 * Why: on a host CPU with AMX, the host kernel accepts PTRACE_SETREGSET of the XSTATE regset
 * only with a buffer of the full XSAVE size (tile data included); user-mode Linux 6.1 (Debian
 * 12) and 6.12 (Debian 13) pass a fixed, smaller one, get EFAULT, and panic at boot ("ptrace
 * set fp regs failed, errno = 14"). With XSTATE refused at its first probe, UML uses the
 * legacy FXSAVE area: x87 and SSE registers are kept per guest thread, AVX upper halves are
 * not (scripts/uml/run tells glibc inside the guest not to use AVX). See scripts/uml/run. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
int main(int argc, char **argv) {
  struct sock_filter f[] = {
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_ptrace, 1, 0),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0x4204, 1, 0),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0x4205, 0, 3),
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[2])),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0x202, 0, 1),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EIO),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = { sizeof(f) / sizeof(f[0]), f };
  if (argc < 2) { fprintf(stderr, "usage: %s program args...\n", argv[0]); return 2; }
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)) { perror("seccomp"); return 1; }
  execvp(argv[1], argv + 1);
  perror("exec"); return 127;
}
