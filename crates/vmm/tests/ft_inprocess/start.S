/* Entry of the in-process FT tests' guest: a stack, then main. */
    .section .text.init
    .globl _start
_start:
    la sp, stack_top
    call main
1:  j 1b
    .bss
    .align 4
    .space 16384
stack_top:
