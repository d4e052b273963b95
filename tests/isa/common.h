/*
 * Shared start-up code, trap handlers and check macros for the bare-metal
 * ISA tests in this folder.
 *
 * Platform contract (QEMU virt layout, also implemented by ftvm):
 *   - every hart starts in M-mode at _start (linked at 0x8000_0000) with
 *     a0 = hart id and a1 = device-tree address;
 *   - SiFive test device at 0x100000: 0x5555 = pass, 0x3333 | (n << 16) =
 *     fail with exit status n;
 *   - 16550 UART at 0x1000_0000 for diagnostics; CLINT at 0x0200_0000.
 *
 * Conventions used by every test:
 *   gp (x3)  number of the check being run; on failure it becomes the exit
 *            status. Checks are numbered 1..254, and 255 means "failed
 *            outside any check" (gp still 0).
 *   tp (x4)  hart id.
 *   t5, t6   clobbered by the ASSERT_* macros (value found / value expected;
 *            printed on the UART when a check fails).
 *   t0-t2    clobbered by most macros.
 * Each check starts with TEST_BEGIN(n), which also defines the label
 * check_<n> so a number used twice is an assembler error and a failing
 * check is easy to find in a disassembly.
 *
 * Traps: a trap taken to M-mode is recorded in trap_area (mcause, mepc,
 * mtval, mstatus, count). If a resume address was armed (SET_RESUME),
 * the handler returns there in M-mode with MIE = 0 (MPIE cleared);
 * otherwise the trap was unexpected and the test fails with the current
 * check number. Traps delegated to S-mode go to trap_s, which records
 * scause/sepc/stval/sstatus and resumes in S-mode at the armed
 * S_RESUME address the same way.
 *
 * A file may define NUM_HARTS before including this header (default 1);
 * harts with a larger id park in a wfi loop. It must define test_main,
 * which ends by jumping to pass (PASS).
 */
#ifndef ISA_COMMON_H
#define ISA_COMMON_H

#ifndef NUM_HARTS
#define NUM_HARTS 1
#endif

/* ---------------------------------------------------------------- devices */
#define TESTDEV         0x100000
#define UART_BASE       0x10000000
#define CLINT_BASE      0x02000000
#define CLINT_MSIP      0x02000000          /* + 4 * hart */
#define CLINT_MTIMECMP  0x02004000          /* + 8 * hart */
#define CLINT_MTIME     0x0200bff8

/* ------------------------------------------------------------ CSR fields */
#define MSTATUS_SIE     (1 << 1)
#define MSTATUS_MIE     (1 << 3)
#define MSTATUS_SPIE    (1 << 5)
#define MSTATUS_MPIE    (1 << 7)
#define MSTATUS_SPP     (1 << 8)
#define MSTATUS_MPP     (3 << 11)
#define MSTATUS_FS      (3 << 13)
#define MSTATUS_MPRV    (1 << 17)
#define MSTATUS_SUM     (1 << 18)
#define MSTATUS_MXR     (1 << 19)
#define MSTATUS_TVM     (1 << 20)
#define MSTATUS_TW      (1 << 21)
#define MSTATUS_TSR     (1 << 22)

#define MODE_U 0
#define MODE_S 1
#define MODE_M 3

#define IRQ_SSI 1
#define IRQ_MSI 3
#define IRQ_STI 5
#define IRQ_MTI 7
#define IRQ_SEI 9
#define IRQ_MEI 11
#define INTR    0x8000000000000000

#define CAUSE_MISALIGNED_FETCH  0
#define CAUSE_FETCH_ACCESS      1
#define CAUSE_ILLEGAL           2
#define CAUSE_BREAKPOINT        3
#define CAUSE_MISALIGNED_LOAD   4
#define CAUSE_LOAD_ACCESS       5
#define CAUSE_MISALIGNED_STORE  6
#define CAUSE_STORE_ACCESS      7
#define CAUSE_ECALL_U           8
#define CAUSE_ECALL_S           9
#define CAUSE_ECALL_M           11
#define CAUSE_FETCH_PAGE        12
#define CAUSE_LOAD_PAGE         13
#define CAUSE_STORE_PAGE        15

#define FFLAG_NX 1
#define FFLAG_UF 2
#define FFLAG_OF 4
#define FFLAG_DZ 8
#define FFLAG_NV 16

/* ------------------------------------------------------- trap_area layout */
#define TA_RESUME   0       /* M handler: where to resume (0 = unexpected) */
#define TA_CAUSE    8       /* mcause of the last M trap (-1 = none yet)   */
#define TA_EPC      16
#define TA_TVAL     24
#define TA_STATUS   32      /* mstatus as seen by the handler              */
#define TA_COUNT    40      /* number of M traps taken                     */
#define TA_SRESUME  48      /* same for traps taken in S-mode              */
#define TA_SCAUSE   56
#define TA_SEPC     64
#define TA_STVAL    72
#define TA_SSTATUS  80
#define TA_SCOUNT   88
#define TA_BOOT_A0  96      /* a0 and a1 as the hart started             */
#define TA_BOOT_A1  104
#define TA_MSAVE    128     /* register save slots of the M handler        */
#define TA_SSAVE    192     /* register save slots of the S handler        */
#define TA_SIZE     256

/* --------------------------------------------------------- check macros */
#define TEST_BEGIN(n)   check_##n: li gp, n

/* Mutation hook for checking the checks: building with -DMUTATE_CHECK=n
   makes every comparison of check n fail (the expected value is inverted;
   inequalities and multi-way checks fail outright), so the
   program must then exit with status n (tests/isa/mutate-on-qemu.sh). */
#ifdef MUTATE_CHECK
#define MUTATE_T6 \
    addi gp, gp, -(MUTATE_CHECK); bnez gp, 7779f; not t6, t6; 7779: addi gp, gp, MUTATE_CHECK
#define MUTATE_FAIL \
    addi gp, gp, -(MUTATE_CHECK); bnez gp, 7779f; addi gp, gp, MUTATE_CHECK; j fail; \
    7779: addi gp, gp, MUTATE_CHECK
#else
#define MUTATE_T6
#define MUTATE_FAIL
#endif

/* Compare a register with a constant / another register. */
#define ASSERT_EQ(reg, val) \
    mv t5, reg; li t6, val; MUTATE_T6; beq t5, t6, 7770f; j fail; 7770:
#define ASSERT_EQ_REG(reg, reg2) \
    mv t5, reg; mv t6, reg2; MUTATE_T6; beq t5, t6, 7770f; j fail; 7770:
#define ASSERT_NE_REG(reg, reg2) \
    mv t5, reg; mv t6, reg2; MUTATE_FAIL; bne t5, t6, 7770f; j fail; 7770:
/* Either of two values (where the spec allows a choice). */
#define ASSERT_EQ2(reg, val1, val2) \
    mv t5, reg; li t6, val1; MUTATE_T6; beq t5, t6, 7775f; \
    li t6, val2; MUTATE_T6; beq t5, t6, 7775f; j fail; 7775:
#define ASSERT_EQ2_REG(reg, reg1, reg2) \
    mv t5, reg; mv t6, reg1; MUTATE_T6; beq t5, t6, 7775f; \
    mv t6, reg2; MUTATE_T6; beq t5, t6, 7775f; j fail; 7775:
/* Unsigned reg >= val / reg > reg2 */
#define ASSERT_GEU(reg, val) \
    mv t5, reg; li t6, val; MUTATE_FAIL; bgeu t5, t6, 7770f; j fail; 7770:
#define ASSERT_GTU_REG(reg, reg2) \
    mv t5, reg; mv t6, reg2; MUTATE_FAIL; bltu t6, t5, 7770f; j fail; 7770:
#define ASSERT_LEU_REG(reg, reg2) \
    mv t5, reg; mv t6, reg2; MUTATE_FAIL; bgeu t6, t5, 7770f; j fail; 7770:
/* Compare a memory location (dword) with a constant. */
#define ASSERT_MEM_D(label, val) la t0, label; ld t0, 0(t0); ASSERT_EQ(t0, val)

/* Integer register-register / register-immediate / unary operations. */
#define TEST_RR(n, op, exp, a, b) \
    TEST_BEGIN(n); li a1, a; li a2, b; op a0, a1, a2; ASSERT_EQ(a0, exp)
#define TEST_RR_SRC1_EQ_DEST(n, op, exp, a, b) \
    TEST_BEGIN(n); li a1, a; li a2, b; op a1, a1, a2; ASSERT_EQ(a1, exp)
#define TEST_RR_SRC2_EQ_DEST(n, op, exp, a, b) \
    TEST_BEGIN(n); li a1, a; li a2, b; op a2, a1, a2; ASSERT_EQ(a2, exp)
#define TEST_RR_SRC12_EQ_DEST(n, op, exp, a) \
    TEST_BEGIN(n); li a1, a; op a1, a1, a1; ASSERT_EQ(a1, exp)
#define TEST_RR_ZERODEST(n, op, a, b) \
    TEST_BEGIN(n); li a1, a; li a2, b; op x0, a1, a2; ASSERT_EQ(x0, 0)
#define TEST_RI(n, op, exp, a, imm) \
    TEST_BEGIN(n); li a1, a; op a0, a1, imm; ASSERT_EQ(a0, exp)
#define TEST_RI_SRC1_EQ_DEST(n, op, exp, a, imm) \
    TEST_BEGIN(n); li a1, a; op a1, a1, imm; ASSERT_EQ(a1, exp)

/* ------------------------------------------------------------- traps */
#define TRAP_FIELD(reg, field)  la reg, trap_area; ld reg, field(reg)

/* Arm the M handler: the next M trap resumes at label (in M-mode). */
#define SET_RESUME(label) \
    la t0, label; la t1, trap_area; sd t0, TA_RESUME(t1); \
    li t0, -1; sd t0, TA_CAUSE(t1)
#define SET_S_RESUME(label) \
    la t0, label; la t1, trap_area; sd t0, TA_SRESUME(t1); \
    li t0, -1; sd t0, TA_SCAUSE(t1)
/* Disarm and check the cause of the trap that should have happened. */
#define ASSERT_TRAP(cause) \
    la t0, trap_area; sd zero, TA_RESUME(t0); ld t0, TA_CAUSE(t0); \
    ASSERT_EQ(t0, cause)
/* The trap cause is one of three values (where the spec allows a choice). */
#define ASSERT_TRAP3(c1, c2, c3) \
    la t0, trap_area; sd zero, TA_RESUME(t0); ld t5, TA_CAUSE(t0); MUTATE_FAIL; \
    li t6, c1; beq t5, t6, 7774f; li t6, c2; beq t5, t6, 7774f; \
    li t6, c3; beq t5, t6, 7774f; j fail; 7774:
#define ASSERT_S_TRAP(cause) \
    la t0, trap_area; sd zero, TA_SRESUME(t0); ld t0, TA_SCAUSE(t0); \
    ASSERT_EQ(t0, cause)
#define ASSERT_TVAL(val)  TRAP_FIELD(t0, TA_TVAL); ASSERT_EQ(t0, val)
#define ASSERT_STVAL(val) TRAP_FIELD(t0, TA_STVAL); ASSERT_EQ(t0, val)
#define ASSERT_TVAL_REG(reg)  TRAP_FIELD(t0, TA_TVAL); ASSERT_EQ_REG(t0, reg)
#define ASSERT_STVAL_REG(reg) TRAP_FIELD(t0, TA_STVAL); ASSERT_EQ_REG(t0, reg)
#define ASSERT_EPC(label) TRAP_FIELD(t0, TA_EPC); la t1, label; ASSERT_EQ_REG(t0, t1)
#define ASSERT_SEPC(label) TRAP_FIELD(t0, TA_SEPC); la t1, label; ASSERT_EQ_REG(t0, t1)

/* Check n: executing the instruction(s) traps to M-mode with this cause
   and mepc pointing at the first of them. */
#define TEST_TRAP(n, cause, ...) \
    TEST_BEGIN(n); SET_RESUME(7771f); 7772: __VA_ARGS__; 7771: \
    ASSERT_TRAP(cause); ASSERT_EPC(7772b)

/* Leave M-mode: continue at label in the given mode (MODE_U / MODE_S). */
#define GOTO_MODE(mode, label) \
    li t0, MSTATUS_MPP; csrc mstatus, t0; li t0, (mode) << 11; \
    csrs mstatus, t0; la t0, label; csrw mepc, t0; mret
/* From S or U mode (ecall not delegated): come back to M-mode here. */
#define BACK_TO_M \
    la t0, 7773f; la t1, trap_area; sd t0, TA_RESUME(t1); ecall; 7773: \
    la t0, trap_area; sd zero, TA_RESUME(t0)

#define PASS j pass
#define FAIL j fail

/* --------------------------------------------------------- FP helpers */
#define BOX_S(x) (0xffffffff00000000 | (x))
#define LOAD_S(freg, bits) li t0, bits; fmv.w.x freg, t0
#define LOAD_D(freg, bits) li t0, bits; fmv.d.x freg, t0
/* Check n: single-precision op on bit patterns; the whole 64-bit register
   is checked, so results must be NaN-boxed. */
#define TEST_FP_S1(n, op, exp, flags, a) \
    TEST_BEGIN(n); LOAD_S(fa0, a); csrw fflags, zero; op fa3, fa0; \
    fmv.x.d a0, fa3; ASSERT_EQ(a0, BOX_S(exp)); csrr a1, fflags; ASSERT_EQ(a1, flags)
#define TEST_FP_S2(n, op, exp, flags, a, b) \
    TEST_BEGIN(n); LOAD_S(fa0, a); LOAD_S(fa1, b); csrw fflags, zero; op fa3, fa0, fa1; \
    fmv.x.d a0, fa3; ASSERT_EQ(a0, BOX_S(exp)); csrr a1, fflags; ASSERT_EQ(a1, flags)
#define TEST_FP_S3(n, op, exp, flags, a, b, c) \
    TEST_BEGIN(n); LOAD_S(fa0, a); LOAD_S(fa1, b); LOAD_S(fa2, c); csrw fflags, zero; \
    op fa3, fa0, fa1, fa2; \
    fmv.x.d a0, fa3; ASSERT_EQ(a0, BOX_S(exp)); csrr a1, fflags; ASSERT_EQ(a1, flags)
#define TEST_FP_D1(n, op, exp, flags, a) \
    TEST_BEGIN(n); LOAD_D(fa0, a); csrw fflags, zero; op fa3, fa0; \
    fmv.x.d a0, fa3; ASSERT_EQ(a0, exp); csrr a1, fflags; ASSERT_EQ(a1, flags)
#define TEST_FP_D2(n, op, exp, flags, a, b) \
    TEST_BEGIN(n); LOAD_D(fa0, a); LOAD_D(fa1, b); csrw fflags, zero; op fa3, fa0, fa1; \
    fmv.x.d a0, fa3; ASSERT_EQ(a0, exp); csrr a1, fflags; ASSERT_EQ(a1, flags)
#define TEST_FP_D3(n, op, exp, flags, a, b, c) \
    TEST_BEGIN(n); LOAD_D(fa0, a); LOAD_D(fa1, b); LOAD_D(fa2, c); csrw fflags, zero; \
    op fa3, fa0, fa1, fa2; \
    fmv.x.d a0, fa3; ASSERT_EQ(a0, exp); csrr a1, fflags; ASSERT_EQ(a1, flags)
/* General form: fa0..fa2 loaded from a, b, c; the instruction(s) given in
   full leave the result in fa3, e.g. "fadd.s fa3, fa0, fa1, rtz". */
#define TEST_FP_S(n, exp, flags, a, b, c, ...) \
    TEST_BEGIN(n); LOAD_S(fa0, a); LOAD_S(fa1, b); LOAD_S(fa2, c); csrw fflags, zero; \
    __VA_ARGS__; \
    fmv.x.d a0, fa3; ASSERT_EQ(a0, BOX_S(exp)); csrr a1, fflags; ASSERT_EQ(a1, flags)
#define TEST_FP_D(n, exp, flags, a, b, c, ...) \
    TEST_BEGIN(n); LOAD_D(fa0, a); LOAD_D(fa1, b); LOAD_D(fa2, c); csrw fflags, zero; \
    __VA_ARGS__; \
    fmv.x.d a0, fa3; ASSERT_EQ(a0, exp); csrr a1, fflags; ASSERT_EQ(a1, flags)
/* FP -> integer register results (compares, fclass, conversions). The
   operation is written in full with a0 as destination and fa0/fa1 as
   sources, e.g. "fcvt.w.s a0, fa0, rtz". */
#define TEST_FP_INT_S(n, exp, flags, a, b, ...) \
    TEST_BEGIN(n); LOAD_S(fa0, a); LOAD_S(fa1, b); csrw fflags, zero; __VA_ARGS__; \
    ASSERT_EQ(a0, exp); csrr a1, fflags; ASSERT_EQ(a1, flags)
#define TEST_FP_INT_D(n, exp, flags, a, b, ...) \
    TEST_BEGIN(n); LOAD_D(fa0, a); LOAD_D(fa1, b); csrw fflags, zero; __VA_ARGS__; \
    ASSERT_EQ(a0, exp); csrr a1, fflags; ASSERT_EQ(a1, flags)
/* integer register -> FP results: a1 holds the integer, result in fa3. */
#define TEST_INT_FP_S(n, exp, flags, a, ...) \
    TEST_BEGIN(n); li a1, a; csrw fflags, zero; __VA_ARGS__; \
    fmv.x.d a0, fa3; ASSERT_EQ(a0, BOX_S(exp)); csrr a1, fflags; ASSERT_EQ(a1, flags)
#define TEST_INT_FP_D(n, exp, flags, a, ...) \
    TEST_BEGIN(n); li a1, a; csrw fflags, zero; __VA_ARGS__; \
    fmv.x.d a0, fa3; ASSERT_EQ(a0, exp); csrr a1, fflags; ASSERT_EQ(a1, flags)

/* ================================================================ code */
    .option nopic
    .option norvc           /* files that test RVC turn it on locally */

    .section .text.init, "ax"
    .globl _start
_start:
    csrr tp, mhartid
    li gp, 0
    /* per-hart trap area, also the scratch of both trap handlers */
    la t0, trap_area
    slli t1, tp, 8
    add t0, t0, t1
    li t1, TA_SIZE
1:  addi t1, t1, -8
    add t2, t0, t1
    sd zero, 0(t2)
    bnez t1, 1b
    sd a0, TA_BOOT_A0(t0)
    sd a1, TA_BOOT_A1(t0)
    li t1, -1
    sd t1, TA_CAUSE(t0)
    sd t1, TA_SCAUSE(t0)
    csrw mscratch, t0
    csrw sscratch, t0
    la t0, trap_m
    csrw mtvec, t0
    la t0, trap_s
    csrw stvec, t0
    /* stack: 4 KiB per hart */
    la sp, stack_top
    slli t1, tp, 12
    sub sp, sp, t1
    /* known state: no interrupts, nothing delegated, no paging */
    csrw mie, zero
    csrw medeleg, zero
    csrw mideleg, zero
    csrw satp, zero
    /* PMP entry 0: NAPOT over the whole address space, RWX, so that S and
       U mode can reach RAM and the devices */
    li t0, -1
    csrw pmpaddr0, t0
    li t0, 0x1f
    csrw pmpcfg0, t0
    /* FPU on (FS = Initial) with a clean fcsr */
    li t0, MSTATUS_FS
    csrc mstatus, t0
    li t0, (1 << 13)
    csrs mstatus, t0
    csrw fcsr, zero
    li t0, NUM_HARTS
    bgeu tp, t0, park
    j test_main
park:
    wfi
    j park

/* ---------------------------------------------------- M-mode trap handler */
    .text
    .balign 4
    .globl trap_m
trap_m:
    csrrw t6, mscratch, t6
    sd t0, TA_MSAVE+0(t6)
    sd t1, TA_MSAVE+8(t6)
    csrr t0, mcause
    sd t0, TA_CAUSE(t6)
    csrr t0, mepc
    sd t0, TA_EPC(t6)
    csrr t0, mtval
    sd t0, TA_TVAL(t6)
    csrr t0, mstatus
    sd t0, TA_STATUS(t6)
    ld t0, TA_COUNT(t6)
    addi t0, t0, 1
    sd t0, TA_COUNT(t6)
    ld t0, TA_RESUME(t6)
    beqz t0, trap_m_unexpected
    sd zero, TA_RESUME(t6)
    csrw mepc, t0
    li t0, MSTATUS_MPP
    csrs mstatus, t0            /* resume in M-mode ...          */
    li t0, MSTATUS_MPIE | MSTATUS_MPRV
    csrc mstatus, t0            /* ... with MIE = 0, MPRV = 0     */
    ld t0, TA_MSAVE+0(t6)
    ld t1, TA_MSAVE+8(t6)
    csrrw t6, mscratch, t6
    mret
trap_m_unexpected:
    la a0, str_trap
    call puts
    csrr a0, mcause
    call puthex
    la a0, str_mepc
    call puts
    csrr a0, mepc
    call puthex
    la a0, str_mtval
    call puts
    csrr a0, mtval
    call puthex
    li a0, '\n'
    call putc
    j fail_exit

/* ---------------------------------------------------- S-mode trap handler */
    .balign 4
    .globl trap_s
trap_s:
    csrrw t6, sscratch, t6
    sd t0, TA_SSAVE+0(t6)
    sd t1, TA_SSAVE+8(t6)
    csrr t0, scause
    sd t0, TA_SCAUSE(t6)
    csrr t0, sepc
    sd t0, TA_SEPC(t6)
    csrr t0, stval
    sd t0, TA_STVAL(t6)
    csrr t0, sstatus
    sd t0, TA_SSTATUS(t6)
    ld t0, TA_SCOUNT(t6)
    addi t0, t0, 1
    sd t0, TA_SCOUNT(t6)
    ld t0, TA_SRESUME(t6)
    beqz t0, trap_s_unexpected
    sd zero, TA_SRESUME(t6)
    csrw sepc, t0
    li t0, MSTATUS_SPP
    csrs sstatus, t0            /* resume in S-mode with SIE = 0 */
    li t0, MSTATUS_SPIE
    csrc sstatus, t0
    ld t0, TA_SSAVE+0(t6)
    ld t1, TA_SSAVE+8(t6)
    csrrw t6, sscratch, t6
    sret
trap_s_unexpected:
    csrr t5, scause
    csrr t6, sepc
    la a0, str_strap
    call puts
    j fail

/* ----------------------------------------------------------- pass / fail */
    .globl pass
pass:
    la a0, str_pass
    call puts
    li t0, TESTDEV
    li t1, 0x5555
    sw t1, 0(t0)
1:  j 1b

/* gp = check number, t5 = value found, t6 = value expected */
    .globl fail
fail:
    mv s10, t5
    mv s11, t6
    la a0, str_fail
    call puts
    mv a0, gp
    call putdec
    la a0, str_got
    call puts
    mv a0, s10
    call puthex
    la a0, str_exp
    call puts
    mv a0, s11
    call puthex
    li a0, '\n'
    call putc
fail_exit:
    mv t0, gp
    li t1, 255
    beqz t0, 1f
    bleu t0, t1, 2f
1:  li t0, 255
2:  slli t0, t0, 16
    li t1, 0x3333
    or t0, t0, t1
    li t1, TESTDEV
    sw t0, 0(t1)
3:  j 3b

/* ------------------------------------------------- UART output (leaves) */
putc:                           /* a0 = byte; clobbers t0, t1 */
    li t0, UART_BASE
1:  lbu t1, 5(t0)
    andi t1, t1, 0x20
    beqz t1, 1b
    sb a0, 0(t0)
    ret
puts:                           /* a0 = NUL-terminated string; clobbers a0, a1, t0-t2 */
    mv t2, ra
    mv a1, a0
1:  lbu a0, 0(a1)
    beqz a0, 2f
    call putc
    addi a1, a1, 1
    j 1b
2:  mv ra, t2
    ret
puthex:                         /* a0 = value, printed as 0x + 16 digits */
    mv t2, ra
    mv a1, a0
    li a0, '0'
    call putc
    li a0, 'x'
    call putc
    li a2, 60
1:  srl a0, a1, a2
    andi a0, a0, 15
    li t0, 10
    blt a0, t0, 2f
    addi a0, a0, 'a' - '0' - 10
2:  addi a0, a0, '0'
    call putc
    addi a2, a2, -4
    bgez a2, 1b
    mv ra, t2
    ret
putdec:                         /* a0 = value 0..999 */
    mv t2, ra
    mv a1, a0
    li a2, 100
    li a3, 0                    /* printed a digit yet? */
1:  divu a0, a1, a2
    remu a1, a1, a2
    bnez a0, 2f
    bnez a3, 2f
    li t0, 1
    bne a2, t0, 3f
2:  addi a0, a0, '0'
    li a3, 1
    call putc
3:  li t0, 10
    divu a2, a2, t0
    bnez a2, 1b
    mv ra, t2
    ret

    .section .rodata
str_pass:  .asciz "PASS\n"
str_fail:  .asciz "FAIL check "
str_got:   .asciz ": got "
str_exp:   .asciz " expected "
str_trap:  .asciz "unexpected trap: mcause "
str_strap: .asciz "unexpected trap in S-mode (got = scause, expected = sepc)\n"
str_mepc:  .asciz " mepc "
str_mtval: .asciz " mtval "

    .bss
    .balign 4096
    .globl trap_area
trap_area:
    .skip TA_SIZE * 4
    .balign 16
stacks:
    .skip 4096 * 4
stack_top:

    .text
#endif
