# Privileged architecture: ecall from M/S/U (mcause/scause), medeleg
# delegation to S-mode, mret/sret and the MPP/SPP/MIE/SIE/MPIE/SPIE
# stacks, mtval/stval for illegal instructions (the instruction bits) and
# for access faults (the address), M/S CSRs and xRET from lower modes,
# misaligned loads/stores (handled or trapping: both legal), ebreak, wfi
# with an interrupt pending, mstatus.TW/TVM/TSR, mepc/sepc alignment.
#include "common.h"

#define BAD_ADDR 0x90000000         /* beyond 128 MiB of RAM: nothing there */

/* read the mstatus saved by the last M trap, field (shift, mask) */
#define TRAP_STATUS_FIELD(reg, shift, mask) \
    TRAP_FIELD(reg, TA_STATUS); srli reg, reg, shift; andi reg, reg, mask

    .text
test_main:
    /* ---- ecall from each mode */
    TEST_TRAP(1, CAUSE_ECALL_M, ecall)
    TEST_BEGIN(2); TRAP_STATUS_FIELD(a0, 11, 3); ASSERT_EQ(a0, 3)    /* MPP = M */
    TEST_BEGIN(3)
    GOTO_MODE(MODE_S, 1f)
1:  SET_RESUME(2f)
3:  ecall
    j fail
2:  ASSERT_TRAP(CAUSE_ECALL_S)
    ASSERT_EPC(3b)
    TRAP_STATUS_FIELD(a0, 11, 3); ASSERT_EQ(a0, 1)                  /* MPP = S */
    TEST_BEGIN(4)
    GOTO_MODE(MODE_U, 1f)
1:  SET_RESUME(2f)
3:  ecall
    j fail
2:  ASSERT_TRAP(CAUSE_ECALL_U)
    ASSERT_EPC(3b)
    TRAP_STATUS_FIELD(a0, 11, 3); ASSERT_EQ(a0, 0)                  /* MPP = U */
    TEST_BEGIN(5)                   /* trap entry: MPIE = old MIE, MIE = 0 */
    csrsi mstatus, MSTATUS_MIE
    SET_RESUME(1f)
    ecall
1:  ASSERT_TRAP(CAUSE_ECALL_M)
    TRAP_STATUS_FIELD(a0, 3, 0x11); ASSERT_EQ(a0, 0x10)             /* MPIE=1 MIE=0 */
    csrr a0, mstatus; andi a0, a0, MSTATUS_MIE; ASSERT_EQ(a0, 0)

    /* ---- mret */
    TEST_BEGIN(6)                   /* to M: MIE = MPIE, MPIE = 1, MPP = U */
    li t0, MSTATUS_MPP | MSTATUS_MIE
    csrc mstatus, t0
    li t0, MSTATUS_MPP | MSTATUS_MPIE
    csrs mstatus, t0
    la t0, 1f
    csrw mepc, t0
    mret
1:  csrr a0, mstatus
    csrci mstatus, MSTATUS_MIE
    srli a1, a0, 11; andi a1, a1, 3; ASSERT_EQ(a1, 0)
    andi a1, a0, MSTATUS_MIE | MSTATUS_MPIE; ASSERT_EQ(a1, MSTATUS_MIE | MSTATUS_MPIE)
    TEST_BEGIN(7)                   /* MPIE = 0: MIE becomes 0 */
    li t0, MSTATUS_MPP | MSTATUS_MIE
    csrs mstatus, t0
    li t0, MSTATUS_MPIE
    csrc mstatus, t0
    la t0, 1f
    csrw mepc, t0
    mret
1:  csrr a0, mstatus
    andi a1, a0, MSTATUS_MIE | MSTATUS_MPIE; ASSERT_EQ(a1, MSTATUS_MPIE)
    /* (mret to a lower mode clearing MPRV is a priv-1.12 rule that QEMU 7.2
       does not follow: not checked) */

    /* ---- sret (executed in S-mode) */
    TEST_BEGIN(8)                   /* to S: SIE = SPIE, SPIE = 1, SPP = U */
    GOTO_MODE(MODE_S, 1f)
1:  li t0, MSTATUS_SPP | MSTATUS_SPIE
    csrs sstatus, t0
    csrci sstatus, MSTATUS_SIE
    la t0, 2f
    csrw sepc, t0
    sret
2:  csrr a0, sstatus
    csrci sstatus, MSTATUS_SIE
    andi a1, a0, MSTATUS_SIE | MSTATUS_SPIE | MSTATUS_SPP
    ASSERT_EQ(a1, MSTATUS_SIE | MSTATUS_SPIE)
    TEST_BEGIN(9)                   /* to U: U-mode cannot read sstatus */
    li t0, MSTATUS_SPP | MSTATUS_SPIE
    csrc sstatus, t0
    csrsi sstatus, MSTATUS_SIE
    la t0, 2f
    csrw sepc, t0
    SET_RESUME(3f)
    sret
2:  csrr a0, sstatus
    j fail
3:  ASSERT_TRAP(CAUSE_ILLEGAL)
    TRAP_STATUS_FIELD(a0, 11, 3); ASSERT_EQ(a0, 0)
    TEST_BEGIN(10)                   /* ... and SIE became SPIE = 0 */
    TRAP_FIELD(a0, TA_STATUS); andi a0, a0, MSTATUS_SIE | MSTATUS_SPIE
    ASSERT_EQ(a0, MSTATUS_SPIE)

    /* ---- delegation with medeleg */
    TEST_BEGIN(11)                   /* ecall from U delegated to S */
    li t0, 1 << CAUSE_ECALL_U
    csrw medeleg, t0
    csrci sstatus, MSTATUS_SIE
    SET_S_RESUME(2f)
    GOTO_MODE(MODE_U, 1f)
1:  ecall
    j fail
2:  ASSERT_S_TRAP(CAUSE_ECALL_U)
    ASSERT_SEPC(1b)
    TRAP_FIELD(a0, TA_SSTATUS); andi a0, a0, MSTATUS_SPP; ASSERT_EQ(a0, 0)
    TEST_BEGIN(12)                   /* we are in S-mode now; S ecall still goes to M */
    SET_RESUME(1f)
    ecall
1:  ASSERT_TRAP(CAUSE_ECALL_S)
    TEST_BEGIN(13)                   /* illegal instruction in S delegated to S:
                                       SPP = S, SPIE = old SIE, SIE = 0, stval = bits */
    li t0, (1 << CAUSE_ILLEGAL)
    csrw medeleg, t0
    GOTO_MODE(MODE_S, 1f)
1:  csrsi sstatus, MSTATUS_SIE
    SET_S_RESUME(2f)
3:  .word 0x1234500b                /* custom-0: not implemented */
    j fail
2:  ASSERT_S_TRAP(CAUSE_ILLEGAL)
    ASSERT_SEPC(3b)
    ASSERT_STVAL(0x1234500b)
    TRAP_FIELD(a0, TA_SSTATUS)
    andi a0, a0, MSTATUS_SPP | MSTATUS_SPIE | MSTATUS_SIE
    ASSERT_EQ(a0, MSTATUS_SPP | MSTATUS_SPIE)
    TEST_BEGIN(14)                   /* M-mode CSR from S: illegal, delegated too */
    SET_S_RESUME(2f)
3:  csrr a0, mstatus
    j fail
2:  ASSERT_S_TRAP(CAUSE_ILLEGAL)
    TRAP_FIELD(a0, TA_SEPC); lwu a1, 0(a0); ASSERT_STVAL_REG(a1)
    BACK_TO_M
    TEST_BEGIN(15)                   /* delegation never sends an M-mode trap down */
    SET_RESUME(1f)
    .word 0x1234500b
1:  ASSERT_TRAP(CAUSE_ILLEGAL)
    TRAP_FIELD(a0, TA_SCAUSE); ASSERT_EQ(a0, CAUSE_ILLEGAL)          /* unchanged */
    TEST_BEGIN(16)                   /* load access fault delegated: stval = address */
    li t0, 1 << CAUSE_LOAD_ACCESS
    csrw medeleg, t0
    GOTO_MODE(MODE_S, 1f)
1:  SET_S_RESUME(2f)
    li a1, BAD_ADDR
    ld a0, 0(a1)
    j fail
2:  ASSERT_S_TRAP(CAUSE_LOAD_ACCESS)
    ASSERT_STVAL(BAD_ADDR)
    BACK_TO_M
    csrw medeleg, zero

    /* ---- mtval: instruction bits, fault addresses */
    TEST_TRAP(17, CAUSE_ILLEGAL, .word 0x1234500b)
    TEST_BEGIN(18); ASSERT_TVAL(0x1234500b)
    li a1, BAD_ADDR + 8
    TEST_TRAP(19, CAUSE_LOAD_ACCESS, lw a0, -4(a1))
    TEST_BEGIN(20); ASSERT_TVAL(BAD_ADDR + 4)
    TEST_TRAP(21, CAUSE_STORE_ACCESS, sd a0, 8(a1))
    TEST_BEGIN(22); ASSERT_TVAL(BAD_ADDR + 16)
    TEST_BEGIN(23)                   /* AMO: store/AMO access fault by the spec;
                                       QEMU 7.2 reports a load access fault */
    SET_RESUME(1f)
    amoadd.w a0, a0, (a1)
1:  ASSERT_TRAP3(CAUSE_STORE_ACCESS, CAUSE_LOAD_ACCESS, CAUSE_STORE_ACCESS)
    TEST_BEGIN(24); ASSERT_TVAL(BAD_ADDR + 8)
    TEST_BEGIN(25)                   /* instruction access fault: mepc = mtval = target */
    SET_RESUME(1f)
    li a1, BAD_ADDR
    jalr ra, 0(a1)
1:  ASSERT_TRAP(CAUSE_FETCH_ACCESS)
    ASSERT_TVAL(BAD_ADDR)
    TRAP_FIELD(a0, TA_EPC); ASSERT_EQ(a0, BAD_ADDR)
    TEST_BEGIN(26)                   /* ... and the same from U-mode */
    SET_RESUME(1f)
    GOTO_MODE(MODE_U, 2f)
2:  li a1, BAD_ADDR + 0x100
    lbu a0, 0(a1)
    j fail
1:  ASSERT_TRAP(CAUSE_LOAD_ACCESS)
    ASSERT_TVAL(BAD_ADDR + 0x100)

    /* ---- misaligned load/store: either done right or trapping with
       cause 4/6 and mtval = address (QEMU 7.2 does them in hardware) */
    TEST_BEGIN(27)
    la a1, mdata
    li a0, 0x8877665544332211
    sd a0, 0(a1)
    li a0, 0xffeeddccbbaa9988
    sd a0, 8(a1)
    addi a2, a1, 3
    li a0, 0
    SET_RESUME(1f)
    ld a0, 0(a2)
    j 2f
1:  ASSERT_TRAP(CAUSE_MISALIGNED_LOAD)
    ASSERT_TVAL_REG(a2)
    j 3f
2:  la t0, trap_area; sd zero, TA_RESUME(t0)
    ASSERT_EQ(a0, 0xaa99888877665544)
3:  TEST_BEGIN(28)
    addi a2, a1, 7
    li a0, 0
    SET_RESUME(1f)
    lh a0, 0(a2)
    j 2f
1:  ASSERT_TRAP(CAUSE_MISALIGNED_LOAD)
    ASSERT_TVAL_REG(a2)
    j 3f
2:  la t0, trap_area; sd zero, TA_RESUME(t0)
    ASSERT_EQ(a0, 0xffffffffffff8888)
3:  TEST_BEGIN(29)
    addi a2, a1, 5
    li a0, 0x0102030405060708
    SET_RESUME(1f)
    sd a0, 0(a2)
    j 2f
1:  ASSERT_TRAP(CAUSE_MISALIGNED_STORE)
    ASSERT_TVAL_REG(a2)
    ld a0, 0(a1); ASSERT_EQ(a0, 0x8877665544332211)    /* nothing written */
    j 3f
2:  la t0, trap_area; sd zero, TA_RESUME(t0)
    ld a0, 0(a1); ASSERT_EQ(a0, 0x0607085544332211)
    ld a0, 8(a1); ASSERT_EQ(a0, 0xffeedd0102030405)
3:

    /* ---- ebreak */
    TEST_TRAP(30, CAUSE_BREAKPOINT, ebreak)
    TEST_BEGIN(31)                   /* mtval is 0 or the pc: both legal */
    TRAP_FIELD(a0, TA_TVAL)
    TRAP_FIELD(a1, TA_EPC)
    ASSERT_EQ2_REG(a0, zero, a1)
    TEST_BEGIN(32)
    SET_RESUME(1f)
    GOTO_MODE(MODE_U, 2f)
2:  ebreak
    j fail
1:  ASSERT_TRAP(CAUSE_BREAKPOINT)
    ASSERT_EPC(2b)

    /* ---- M-only things from S and U */
    TEST_BEGIN(33)
    SET_RESUME(1f)
    GOTO_MODE(MODE_S, 2f)
2:  csrw mscratch, zero
    j fail
1:  ASSERT_TRAP(CAUSE_ILLEGAL)
    TRAP_FIELD(a0, TA_EPC); lwu a1, 0(a0); ASSERT_TVAL_REG(a1)
    TEST_BEGIN(34)
    SET_RESUME(1f)
    GOTO_MODE(MODE_S, 2f)
2:  mret
    j fail
1:  ASSERT_TRAP(CAUSE_ILLEGAL)
    ASSERT_EPC(2b)
    TEST_BEGIN(35)
    SET_RESUME(1f)
    GOTO_MODE(MODE_U, 2f)
2:  csrr a0, mhartid
    j fail
1:  ASSERT_TRAP(CAUSE_ILLEGAL)
    TEST_BEGIN(36)
    SET_RESUME(1f)
    GOTO_MODE(MODE_U, 2f)
2:  sret
    j fail
1:  ASSERT_TRAP(CAUSE_ILLEGAL)
    TEST_BEGIN(37)
    SET_RESUME(1f)
    GOTO_MODE(MODE_U, 2f)
2:  csrw sscratch, zero
    j fail
1:  ASSERT_TRAP(CAUSE_ILLEGAL)
    TEST_BEGIN(38)
    SET_RESUME(1f)
    GOTO_MODE(MODE_U, 2f)
2:  sfence.vma
    j fail
1:  ASSERT_TRAP(CAUSE_ILLEGAL)

    /* ---- wfi */
    TEST_BEGIN(39)                   /* M-mode, MIE = 0, MSIP pending and enabled:
                                       wfi completes, no trap is taken */
    TRAP_FIELD(s0, TA_COUNT)
    li a1, CLINT_MSIP
    li a0, 1
    sw a0, 0(a1)
    li t0, 1 << IRQ_MSI
    csrw mie, t0
    csrci mstatus, MSTATUS_MIE
1:  csrr a0, mip
    andi a0, a0, 1 << IRQ_MSI
    beqz a0, 1b                     /* the IPI reaches mip */
    wfi
    sw zero, 0(a1)
    csrw mie, zero
    TRAP_FIELD(s1, TA_COUNT)
    ASSERT_EQ_REG(s0, s1)
    TEST_BEGIN(40)                   /* TW = 1: wfi in S is illegal */
    li t0, MSTATUS_TW
    csrs mstatus, t0
    SET_RESUME(1f)
    GOTO_MODE(MODE_S, 2f)
2:  wfi
    j fail
1:  ASSERT_TRAP(CAUSE_ILLEGAL)
    ASSERT_EPC(2b)
    li t0, MSTATUS_TW
    csrc mstatus, t0
    TEST_BEGIN(41)                   /* TW = 0: wfi in S with a pending, locally
                                       enabled but globally masked S interrupt */
    li t0, 1 << IRQ_SSI
    csrw mideleg, t0
    csrw mie, t0
    csrs mip, t0
    GOTO_MODE(MODE_S, 2f)
2:  csrci sstatus, MSTATUS_SIE
    wfi
    BACK_TO_M
    ASSERT_TRAP(CAUSE_ECALL_S)
    li t0, 1 << IRQ_SSI
    csrc mip, t0
    csrw mie, zero
    csrw mideleg, zero
    TEST_BEGIN(42)                   /* wfi in U is illegal */
    SET_RESUME(1f)
    GOTO_MODE(MODE_U, 2f)
2:  wfi
    j fail
1:  ASSERT_TRAP(CAUSE_ILLEGAL)

    /* ---- TVM */
    TEST_BEGIN(43)
    GOTO_MODE(MODE_S, 2f)
2:  csrr a0, satp
    sfence.vma
    BACK_TO_M
    ASSERT_TRAP(CAUSE_ECALL_S)
    TEST_BEGIN(44)
    li t0, MSTATUS_TVM
    csrs mstatus, t0
    SET_RESUME(1f)
    GOTO_MODE(MODE_S, 2f)
2:  csrr a0, satp
    j fail
1:  ASSERT_TRAP(CAUSE_ILLEGAL)
    TEST_BEGIN(45)
    SET_RESUME(1f)
    GOTO_MODE(MODE_S, 2f)
2:  sfence.vma
    j fail
1:  ASSERT_TRAP(CAUSE_ILLEGAL)
    TEST_BEGIN(46)
    SET_RESUME(1f)
    GOTO_MODE(MODE_S, 2f)
2:  csrw satp, zero
    j fail
1:  ASSERT_TRAP(CAUSE_ILLEGAL)
    TEST_BEGIN(47)                   /* M-mode is not affected */
    csrr a0, satp
    sfence.vma
    li t0, MSTATUS_TVM
    csrc mstatus, t0
    ASSERT_EQ(a0, 0)

    /* ---- TSR */
    TEST_BEGIN(48)
    li t0, MSTATUS_TSR
    csrs mstatus, t0
    SET_RESUME(1f)
    GOTO_MODE(MODE_S, 2f)
2:  la t0, 3f
    csrw sepc, t0
4:  sret
3:  j fail
1:  ASSERT_TRAP(CAUSE_ILLEGAL)
    ASSERT_EPC(4b)
    TEST_BEGIN(49)                   /* M-mode may still use sret */
    li t0, MSTATUS_SPP
    csrs mstatus, t0
    la t0, 2f
    csrw sepc, t0
    sret
2:  BACK_TO_M                       /* now in S */
    ASSERT_TRAP(CAUSE_ECALL_S)
    li t0, MSTATUS_TSR
    csrc mstatus, t0

    /* ---- mepc/sepc with IALIGN = 16: bit 1 is kept; bit 0 always reads 0
       by the spec, but QEMU 7.2 keeps it too, so both are accepted */
    TEST_BEGIN(50); li a1, 0x80001002; csrw mepc, a1; csrr a0, mepc; ASSERT_EQ(a0, 0x80001002)
    TEST_BEGIN(51); li a1, 0x80001006; csrw sepc, a1; csrr a0, sepc; ASSERT_EQ(a0, 0x80001006)
    TEST_BEGIN(52)
    li a1, 0x80001003; csrw mepc, a1; csrr a0, mepc
    ASSERT_EQ2(a0, 0x80001002, 0x80001003)
    TEST_BEGIN(53)
    li a1, 0x80001001; csrw sepc, a1; csrr a0, sepc
    ASSERT_EQ2(a0, 0x80001000, 0x80001001)

    PASS

    .data
    .balign 8
mdata:  .dword 0, 0
