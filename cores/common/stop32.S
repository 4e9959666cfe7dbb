/* stop32: a 32-bit (i386) program that stops itself with SIGSTOP, for the test that heapwalk refuses
 * 32-bit targets in one line.  Plain system calls, so it builds with binutils alone (as --32, ld -m
 * elf_i386): no 32-bit libc is needed. */
        .text
        .globl _start
_start:
        movl $20, %eax          /* getpid */
        int $0x80
        movl %eax, %ebx
        movl $37, %eax          /* kill(pid, SIGSTOP) */
        movl $19, %ecx
        int $0x80
        movl $1, %eax           /* exit(0) */
        xorl %ebx, %ebx
        int $0x80
