# qemu: skip (QEMU 7.2, the reference here, has neither Zicbom nor Zicboz: cbo.* are illegal there; QEMU 8.0 added them)
# Zicboz and Zicbom: cbo.zero zeroes the naturally aligned 64-byte block
# holding its address and nothing else; cbo.clean/flush/inval leave
# memory as it is; menvcfg and senvcfg hold CBZE, CBCFE and CBIE, which
# gate the instructions in S-mode (menvcfg) and U-mode (both); under
# Sv39 cbo.zero needs write permission and sets A and D, the management
# instructions need a load's, and their faults are store page faults
# with mtval = rs1 as given (not the block's start); outside any memory
# cbo.zero is a store access fault; a cbo.zero over the running code is
# seen by the next fetch. Written with .insn: rv64gc assembles it.
#include "common.h"

#define MENVCFG 0x30a
#define SENVCFG 0x10a
#define CBIE_FLUSH (1 << 4)
#define CBIE_INVAL (3 << 4)
#define CBCFE (1 << 6)
#define CBZE  (1 << 7)
#define CB_ALL (CBIE_INVAL | CBCFE | CBZE)

#define CBO_INVAL(r) .insn i 0x0f, 2, x0, r, 0
#define CBO_CLEAN(r) .insn i 0x0f, 2, x0, r, 1
#define CBO_FLUSH(r) .insn i 0x0f, 2, x0, r, 2
#define CBO_ZERO(r)  .insn i 0x0f, 2, x0, r, 4

#define PTE_V 0x01
#define PTE_R 0x02
#define PTE_W 0x04
#define PTE_X 0x08
#define PTE_A 0x40
#define PTE_D 0x80
#define SATP_SV39 (8 << 60)
/* Sv39 gigapages: root[2] identity (the program, S-mode), root[3] ->
   RAM read-only, root[4] -> RAM writable with A = D = 0; root[1] none. */
#define VA_RO    0xc0000000
#define VA_AD    0x100000000
#define VA_NONE  0x40000000

/* Run snippet snip on a2 in mode: a0 = mcause (the snippet's ecall, 8, 9
   or 11, if the instruction retired), a1 = mtval, a5 = mepc. */
#define RUN(mode, snip) li a0, mode; la a1, snip; call run_in_mode
#define RETIRED_S ASSERT_EQ(a0, CAUSE_ECALL_S)
#define RETIRED_U ASSERT_EQ(a0, CAUSE_ECALL_U)
#define ILLEGAL   ASSERT_EQ(a0, CAUSE_ILLEGAL)
#define SET_ENVCFG(m, s) li t0, m; csrw MENVCFG, t0; li t0, s; csrw SENVCFG, t0

/* Fill the 256-byte buffer with 0xa5a5...; check dword `off` of it. */
#define FILL call fill_buf
#define BUF_D(off, val) la t0, buf; ld t0, off(t0); ASSERT_EQ(t0, val)
#define PATTERN 0xa5a5a5a5a5a5a5a5

    .text
test_main:
    TEST_BEGIN(1)                   /* the enables are writable */
    SET_ENVCFG(CB_ALL, CB_ALL)
    csrr a0, MENVCFG; andi a0, a0, CB_ALL; ASSERT_EQ(a0, CB_ALL)
    TEST_BEGIN(2)
    csrr a0, SENVCFG; andi a0, a0, CB_ALL; ASSERT_EQ(a0, CB_ALL)
    TEST_BEGIN(3)
    li t0, CBIE_FLUSH; csrw SENVCFG, t0
    csrr a0, SENVCFG; andi a0, a0, CB_ALL; ASSERT_EQ(a0, CBIE_FLUSH)

    /* cbo.zero in M-mode: the block holding buf + 0x53, only it */
    TEST_BEGIN(4)
    FILL
    la a2, buf; addi a2, a2, 0x53
    RUN(MODE_M, snip_zero); ASSERT_EQ(a0, CAUSE_ECALL_M)
    TEST_BEGIN(5); BUF_D(0x38, PATTERN)
    TEST_BEGIN(6); BUF_D(0x40, 0)
    TEST_BEGIN(7); BUF_D(0x58, 0)
    TEST_BEGIN(8); BUF_D(0x78, 0)
    TEST_BEGIN(9); BUF_D(0x80, PATTERN)
    TEST_BEGIN(10)                  /* rs1 is not written */
    la t0, buf; addi t0, t0, 0x53; ASSERT_EQ_REG(a2, t0)

    /* the management instructions change nothing */
    TEST_BEGIN(11)
    FILL
    la a2, buf; addi a2, a2, 0x48
    RUN(MODE_M, snip_clean); ASSERT_EQ(a0, CAUSE_ECALL_M); BUF_D(0x40, PATTERN)
    TEST_BEGIN(12)
    RUN(MODE_M, snip_flush); ASSERT_EQ(a0, CAUSE_ECALL_M); BUF_D(0x40, PATTERN)
    TEST_BEGIN(13)
    RUN(MODE_M, snip_inval); ASSERT_EQ(a0, CAUSE_ECALL_M); BUF_D(0x48, PATTERN)

    /* S-mode: menvcfg decides, senvcfg does not */
    la a2, buf
    TEST_BEGIN(14); SET_ENVCFG(0, CB_ALL); RUN(MODE_S, snip_zero); ILLEGAL
    TEST_BEGIN(15); TRAP_FIELD(t0, TA_TVAL); ASSERT_EQ2(t0, 0, 0x0046200f)
    TEST_BEGIN(16); RUN(MODE_S, snip_clean); ILLEGAL
    TEST_BEGIN(17); RUN(MODE_S, snip_flush); ILLEGAL
    TEST_BEGIN(18); RUN(MODE_S, snip_inval); ILLEGAL
    TEST_BEGIN(19); SET_ENVCFG(CBZE, 0); FILL; RUN(MODE_S, snip_zero); RETIRED_S; BUF_D(0, 0)
    TEST_BEGIN(20); RUN(MODE_S, snip_clean); ILLEGAL
    TEST_BEGIN(21); SET_ENVCFG(CBCFE, 0); RUN(MODE_S, snip_clean); RETIRED_S
    TEST_BEGIN(22); RUN(MODE_S, snip_flush); RETIRED_S
    TEST_BEGIN(23); RUN(MODE_S, snip_zero); ILLEGAL
    TEST_BEGIN(24); RUN(MODE_S, snip_inval); ILLEGAL
    TEST_BEGIN(25); SET_ENVCFG(CBIE_FLUSH, 0); FILL; RUN(MODE_S, snip_inval); RETIRED_S
    BUF_D(0, PATTERN)
    TEST_BEGIN(26); SET_ENVCFG(CBIE_INVAL, 0); RUN(MODE_S, snip_inval); RETIRED_S
    BUF_D(0, PATTERN)

    /* U-mode: both must allow it */
    TEST_BEGIN(27); SET_ENVCFG(CB_ALL, 0); RUN(MODE_U, snip_zero); ILLEGAL
    TEST_BEGIN(28); RUN(MODE_U, snip_clean); ILLEGAL
    TEST_BEGIN(29); RUN(MODE_U, snip_inval); ILLEGAL
    TEST_BEGIN(30); SET_ENVCFG(0, CB_ALL); RUN(MODE_U, snip_zero); ILLEGAL
    TEST_BEGIN(31); RUN(MODE_U, snip_flush); ILLEGAL
    TEST_BEGIN(32); RUN(MODE_U, snip_inval); ILLEGAL
    TEST_BEGIN(33); SET_ENVCFG(CB_ALL, CB_ALL); FILL; RUN(MODE_U, snip_zero); RETIRED_U; BUF_D(0, 0)
    TEST_BEGIN(34); RUN(MODE_U, snip_clean); RETIRED_U
    TEST_BEGIN(35); SET_ENVCFG(CB_ALL, CBIE_FLUSH); RUN(MODE_U, snip_inval); RETIRED_U
    TEST_BEGIN(36); SET_ENVCFG(CBIE_FLUSH, CBIE_INVAL); RUN(MODE_U, snip_inval); RETIRED_U

    /* outside any memory: a store access fault at rs1 */
    TEST_BEGIN(37)
    li a2, 0x13
    RUN(MODE_M, snip_zero); ASSERT_EQ(a0, CAUSE_STORE_ACCESS); ASSERT_EQ(a1, 0x13)

    /* ---- under Sv39, in S-mode */
    SET_ENVCFG(CB_ALL, 0)
    la a0, pt_root
    li t0, 4096
    add a1, a0, t0
1:  sd zero, 0(a0)
    addi a0, a0, 8
    bltu a0, a1, 1b
    la a0, pt_root
    li t0, (0x80000000 >> 12) << 10
    ori t1, t0, PTE_V | PTE_R | PTE_W | PTE_X | PTE_A | PTE_D
    sd t1, 16(a0)
    ori t1, t0, PTE_V | PTE_R | PTE_A
    sd t1, 24(a0)
    ori t1, t0, PTE_V | PTE_R | PTE_W
    sd t1, 32(a0)
    srli a0, a0, 12
    li t0, SATP_SV39
    or a0, a0, t0
    csrw satp, a0
    sfence.vma

    /* writable with A = D = 0: zeroed, and A and D set */
    TEST_BEGIN(38)
    FILL
    la a2, buf; li t0, 0x80000000; sub a2, a2, t0; li t0, VA_AD; add a2, a2, t0
    addi a2, a2, 0x7f
    RUN(MODE_S, snip_zero); RETIRED_S
    BUF_D(0x40, 0)
    TEST_BEGIN(39)
    BUF_D(0x80, PATTERN)
    TEST_BEGIN(40)
    la t0, pt_root; ld t0, 32(t0); andi t0, t0, PTE_A | PTE_D; ASSERT_EQ(t0, PTE_A | PTE_D)
    /* read-only: cbo.zero faults at rs1, the others may access it */
    la a2, buf; li t0, 0x80000000; sub a2, a2, t0; li t0, VA_RO; add a2, a2, t0
    addi a2, a2, 0x2b
    TEST_BEGIN(41); FILL; RUN(MODE_S, snip_zero); ASSERT_EQ(a0, CAUSE_STORE_PAGE); ASSERT_EQ_REG(a1, a2)
    TEST_BEGIN(42); BUF_D(0, PATTERN)
    TEST_BEGIN(43); RUN(MODE_S, snip_clean); RETIRED_S
    TEST_BEGIN(44); RUN(MODE_S, snip_flush); RETIRED_S
    TEST_BEGIN(45); RUN(MODE_S, snip_inval); RETIRED_S
    /* unmapped: store page faults at rs1 from all four */
    li a2, VA_NONE + 0x1235
    TEST_BEGIN(46); RUN(MODE_S, snip_zero); ASSERT_EQ(a0, CAUSE_STORE_PAGE); ASSERT_EQ(a1, VA_NONE + 0x1235)
    TEST_BEGIN(47); RUN(MODE_S, snip_clean); ASSERT_EQ(a0, CAUSE_STORE_PAGE); ASSERT_EQ(a1, VA_NONE + 0x1235)
    TEST_BEGIN(48); RUN(MODE_S, snip_flush); ASSERT_EQ(a0, CAUSE_STORE_PAGE); ASSERT_EQ(a1, VA_NONE + 0x1235)
    TEST_BEGIN(49); RUN(MODE_S, snip_inval); ASSERT_EQ(a0, CAUSE_STORE_PAGE); ASSERT_EQ(a1, VA_NONE + 0x1235)
    csrw satp, zero
    sfence.vma

    /* a cbo.zero over the code running it: the next fetch sees zeros */
    TEST_BEGIN(50)
    la a2, smc_block
    la t0, smc_pad; sd zero, 0(t0)  /* its page in the store TLB */
    call smc_warm                   /* and in the fetch TLB */
    li a3, 0
    SET_RESUME(1f)
    jr a2
1:  ASSERT_TRAP(CAUSE_ILLEGAL)
    TEST_BEGIN(51); ASSERT_EQ(a3, 0)
    TEST_BEGIN(52); ASSERT_EPC(smc_next)
    PASS

run_in_mode:
    la t0, 1f
    la t1, trap_area
    sd t0, TA_RESUME(t1)
    li t0, -1
    sd t0, TA_CAUSE(t1)
    li t0, MSTATUS_MPP
    csrc mstatus, t0
    slli t0, a0, 11
    csrs mstatus, t0
    csrw mepc, a1
    mret
1:  la t1, trap_area
    ld a0, TA_CAUSE(t1)
    ld a1, TA_TVAL(t1)
    ld a5, TA_EPC(t1)
    ret

fill_buf:
    la t0, buf
    li t1, PATTERN
    addi t2, t0, 256
1:  sd t1, 0(t0)
    addi t0, t0, 8
    bltu t0, t2, 1b
    ret

snip_zero:  CBO_ZERO(a2); ecall
snip_clean: CBO_CLEAN(a2); ecall
snip_flush: CBO_FLUSH(a2); ecall
snip_inval: CBO_INVAL(a2); ecall

    /* a page of its own: the store before it brings the page into the
       store TLB and the call to smc_warm into the fetch TLB, so that the
       block runs from the block cache, not as a single instruction
       fetched through the MMU's slow path */
    .balign 4096
smc_warm:
    ret
    .balign 64
smc_block:
    CBO_ZERO(a2)
smc_next:
    addi a3, a3, 1
    addi a3, a3, 1
    j fail
    .balign 64
smc_pad:
    .dword 0

    .data
    .balign 4096
pt_root:
    .zero 4096
    .balign 64
buf:
    .zero 256
