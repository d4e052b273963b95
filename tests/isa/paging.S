# Sv39 and Sv48 paging: 4 KiB, 2 MiB, 1 GiB and 512 GiB pages; U-bit
# rules with SUM and MXR; execute-only pages; A and D bits set by the
# hardware; load/store/fetch page faults with mtval = the faulting address;
# misaligned superpages; reserved PTE encodings; non-canonical addresses;
# sfence.vma (global, by address, by an address in a superpage); an instruction that crosses into an
# unmapped page; MPRV; delegated page faults; satp WARL for unsupported
# modes. M-mode builds the tables and runs tiny snippets in S or U mode
# (run_in_mode); every trap lands in M-mode and is checked there.
#include "common.h"

#define PTE_V 0x01
#define PTE_R 0x02
#define PTE_W 0x04
#define PTE_X 0x08
#define PTE_U 0x10
#define PTE_G 0x20
#define PTE_A 0x40
#define PTE_D 0x80
#define RWX_AD (PTE_V | PTE_R | PTE_W | PTE_X | PTE_A | PTE_D)
#define RW_AD  (PTE_V | PTE_R | PTE_W | PTE_A | PTE_D)

#define DATA2M   0x80200000         /* physical scratch, 2 MiB aligned */
#define PAGES    0x80400000         /* physical scratch, 4 KiB pages */
#define VA_2M    0x40000000         /* l1[0]: 2 MiB page -> DATA2M */
#define VA_4K    0x40200000         /* l1[1]: 4 KiB pages (pt_l0) */
#define VA_MIS2M 0x40400000         /* l1[2]: misaligned 2 MiB leaf */
#define VA_1G    0xc0000000         /* root[3]: 1 GiB page -> 0x8000_0000 */
#define VA_MIS1G 0x100000000        /* root[4]: misaligned 1 GiB leaf */
/* the 4 KiB pages at VA_4K + n * 0x1000 */
#define P_RW     0                  /* S read/write -> PAGES + 0 */
#define P_RO     1                  /* S read-only -> PAGES + 0x1000 */
#define P_XO     2                  /* S execute-only -> snippet page */
#define P_URW    3                  /* U read/write -> PAGES + 0x3000 */
#define P_UX     4                  /* U read/execute -> snippet page */
#define P_NONE   5                  /* invalid */
#define P_WO     6                  /* W without R: reserved */
#define P_AD     7                  /* R/W with A = D = 0 -> PAGES + 0x7000 */
#define P_REMAP  8                  /* -> PAGES + 0x8000, then + 0x9000 */
#define P_XCROSS 10                 /* S execute -> PAGES + 0xa000 ... */
#define P_XNONE  11                 /* ... followed by an invalid page */
#define P_PTR    12                 /* pointer PTE at the last level */
#define VA(n)    (VA_4K + (n) * 0x1000)

#define SATP_SV39 (8 << 60)
#define SATP_SV48 (9 << 60)

/* map: table[idx] = leaf/pointer to physical address in register pa */
#define SET_PTE(table, idx, pa, flags) \
    la a0, table; li a1, idx; mv a2, pa; li a3, flags; call set_pte
#define SET_PTE_PA(table, idx, paconst, flags) \
    li a2, paconst; SET_PTE(table, idx, a2, flags)
#define SET_PTE_SYM(table, idx, sym, flags) \
    la a2, sym; SET_PTE(table, idx, a2, flags)

/* run a snippet: mode, entry (register), arguments in a2/a4; afterwards
   a0 = mcause, a1 = mtval, a5 = mepc, a3 = what the snippet loaded */
#define RUN_S(snip)  li a0, MODE_S; la a1, snip; call run_in_mode
#define RUN_U(snip)  li a0, MODE_U; la a1, snip; call to_user_va; call run_in_mode
#define S_LOAD(va)   li a2, va; RUN_S(snip_load)
#define S_STORE(va, val) li a2, va; li a4, val; RUN_S(snip_store)
#define U_LOAD(va)   li a2, va; RUN_U(snip_load)
#define U_STORE(va, val) li a2, va; li a4, val; RUN_U(snip_store)
#define EXPECT_OK_S  ASSERT_EQ(a0, CAUSE_ECALL_S)
#define EXPECT_OK_U  ASSERT_EQ(a0, CAUSE_ECALL_U)
#define EXPECT_FAULT(cause, va) ASSERT_EQ(a0, cause); ASSERT_EQ(a1, va)

    .text
test_main:
    /* ---- Sv39 tables (cleared first: RAM need not start zeroed) */
    la a0, pt_root
    la a1, pt_end
1:  sd zero, 0(a0)
    addi a0, a0, 8
    bltu a0, a1, 1b
    SET_PTE_PA(pt_root, 2, 0x80000000, RWX_AD)            /* identity, S only */
    SET_PTE_PA(pt_root, 3, 0x80000000, PTE_V | PTE_R | PTE_A)
    SET_PTE_PA(pt_root, 4, 0x80200000, RW_AD)             /* misaligned 1G */
    SET_PTE_SYM(pt_root, 1, pt_l1, PTE_V)
    SET_PTE_PA(pt_l1, 0, DATA2M, RW_AD)
    SET_PTE_SYM(pt_l1, 1, pt_l0, PTE_V)
    SET_PTE_PA(pt_l1, 2, DATA2M + 0x1000, RW_AD)          /* misaligned 2M */
    SET_PTE_PA(pt_l0, P_RW, PAGES, RW_AD)
    SET_PTE_PA(pt_l0, P_RO, PAGES + 0x1000, PTE_V | PTE_R | PTE_A)
    SET_PTE_SYM(pt_l0, P_XO, snip_page, PTE_V | PTE_X | PTE_A)
    SET_PTE_PA(pt_l0, P_URW, PAGES + 0x3000, RW_AD | PTE_U)
    SET_PTE_SYM(pt_l0, P_UX, snip_page, PTE_V | PTE_R | PTE_X | PTE_A | PTE_U)
    SET_PTE_PA(pt_l0, P_WO, PAGES + 0x6000, PTE_V | PTE_W | PTE_A | PTE_D)
    SET_PTE_PA(pt_l0, P_AD, PAGES + 0x7000, PTE_V | PTE_R | PTE_W)
    SET_PTE_PA(pt_l0, P_REMAP, PAGES + 0x8000, RW_AD)
    SET_PTE_PA(pt_l0, P_XCROSS, PAGES + 0xa000, PTE_V | PTE_R | PTE_X | PTE_A)
    SET_PTE_SYM(pt_l0, P_PTR, pt_l0, PTE_V)
    /* test data */
    li a0, DATA2M + 0x1238; li a1, 0x1111222233334444; sd a1, 0(a0)
    li a0, PAGES + 0x10;    li a1, 0x5555666677778888; sd a1, 0(a0)
    li a0, PAGES + 0x1010;  li a1, 0x0123456789abcdef; sd a1, 0(a0)
    li a0, PAGES + 0x3020;  li a1, 0x3333333333333333; sd a1, 0(a0)
    li a0, PAGES + 0x8000;  li a1, 111; sd a1, 0(a0)
    li a0, PAGES + 0x9000;  li a1, 222; sd a1, 0(a0)
    li a0, PAGES + 0xaffe;  li a1, 0x0513; sh a1, 0(a0)   /* low half of a 32-bit insn */
    fence.i

    /* ---- satp */
    TEST_BEGIN(1)
    la a0, pt_root
    srli a0, a0, 12
    li a1, SATP_SV39
    or s2, a0, a1                   /* s2 = Sv39 satp */
    csrw satp, s2
    sfence.vma
    csrr a0, satp
    ASSERT_EQ_REG(a0, s2)
    TEST_BEGIN(2)                   /* unsupported modes: the write is ignored */
    li a1, (11 << 60) | 0x12345
    csrw satp, a1
    csrr a0, satp
    ASSERT_EQ_REG(a0, s2)
    li a1, (5 << 60) | 0x12345
    csrw satp, a1
    csrr a0, satp
    ASSERT_EQ_REG(a0, s2)
    TEST_BEGIN(3)                   /* Sv57: accepted (QEMU 7.2) or ignored */
    la a0, pt_root
    srli a0, a0, 12
    li a1, 10 << 60
    or a1, a1, a0
    csrw satp, a1
    csrr a0, satp
    ASSERT_EQ2_REG(a0, a1, s2)
    csrw satp, s2
    sfence.vma

    /* ---- page sizes */
    TEST_BEGIN(4); S_LOAD(VA_2M + 0x1238); EXPECT_OK_S; ASSERT_EQ(a3, 0x1111222233334444)
    TEST_BEGIN(5); S_LOAD(VA_1G + 0x201238); EXPECT_OK_S; ASSERT_EQ(a3, 0x1111222233334444)
    TEST_BEGIN(6); S_LOAD(VA(P_RW) + 0x10); EXPECT_OK_S; ASSERT_EQ(a3, 0x5555666677778888)
    TEST_BEGIN(7); S_STORE(VA(P_RW) + 0x18, 0x7777); EXPECT_OK_S
    li a0, PAGES + 0x18; ld a0, 0(a0); ASSERT_EQ(a0, 0x7777)
    TEST_BEGIN(8); S_STORE(VA_2M + 0x1ffff8, 0x2222); EXPECT_OK_S
    li a0, DATA2M + 0x1ffff8; ld a0, 0(a0); ASSERT_EQ(a0, 0x2222)
    TEST_BEGIN(9)                   /* identity gigapage: the program's own data */
    la a2, vdata; RUN_S(snip_load); EXPECT_OK_S; ASSERT_EQ(a3, 0x0f0f0f0f0f0f0f0f)

    /* ---- page faults, mtval = faulting address */
    TEST_BEGIN(10); S_LOAD(VA(P_NONE) + 8); EXPECT_FAULT(CAUSE_LOAD_PAGE, VA(P_NONE) + 8)
    TEST_BEGIN(11); S_STORE(VA(P_NONE) + 16, 1); EXPECT_FAULT(CAUSE_STORE_PAGE, VA(P_NONE) + 16)
    TEST_BEGIN(12); li a2, VA(P_NONE); RUN_S(snip_jump)
    EXPECT_FAULT(CAUSE_FETCH_PAGE, VA(P_NONE)); ASSERT_EQ(a5, VA(P_NONE))
    TEST_BEGIN(13); S_LOAD(VA(P_RO) + 0x10); EXPECT_OK_S; ASSERT_EQ(a3, 0x0123456789abcdef)
    TEST_BEGIN(14); S_STORE(VA(P_RO) + 0x10, 1); EXPECT_FAULT(CAUSE_STORE_PAGE, VA(P_RO) + 0x10)
    li a0, PAGES + 0x1010; ld a0, 0(a0); ASSERT_EQ(a0, 0x0123456789abcdef)
    TEST_BEGIN(15); li a2, VA(P_RW); RUN_S(snip_jump); EXPECT_FAULT(CAUSE_FETCH_PAGE, VA(P_RW))
    TEST_BEGIN(16); S_LOAD(VA(P_WO)); EXPECT_FAULT(CAUSE_LOAD_PAGE, VA(P_WO))
    TEST_BEGIN(17); S_STORE(VA(P_WO) + 8, 1); EXPECT_FAULT(CAUSE_STORE_PAGE, VA(P_WO) + 8)
    TEST_BEGIN(18); S_LOAD(VA(P_PTR) + 0x20); EXPECT_FAULT(CAUSE_LOAD_PAGE, VA(P_PTR) + 0x20)
    TEST_BEGIN(19); S_LOAD(VA_MIS2M + 0x40); EXPECT_FAULT(CAUSE_LOAD_PAGE, VA_MIS2M + 0x40)
    TEST_BEGIN(20); S_LOAD(VA_MIS1G + 0x80); EXPECT_FAULT(CAUSE_LOAD_PAGE, VA_MIS1G + 0x80)
    TEST_BEGIN(21); S_LOAD(0x1000); EXPECT_FAULT(CAUSE_LOAD_PAGE, 0x1000)
    TEST_BEGIN(22); S_LOAD(0xffffffc000000000); EXPECT_FAULT(CAUSE_LOAD_PAGE, 0xffffffc000000000)
    TEST_BEGIN(23)                   /* Sv39: bits 63..39 must equal bit 38 */
    S_LOAD(0x4000000000); ASSERT_EQ(a0, CAUSE_LOAD_PAGE)
    TEST_BEGIN(24); S_STORE(0x8080000000, 1); ASSERT_EQ(a0, CAUSE_STORE_PAGE)

    /* ---- execute-only pages and MXR */
    TEST_BEGIN(25)                   /* executing it works */
    li a0, MODE_S; la a1, snip_ecall; call to_xo_va; call run_in_mode; EXPECT_OK_S
    TEST_BEGIN(26)                   /* loading from it faults without MXR */
    la a1, snip_ecall; call to_xo_va; mv a2, a1; mv s3, a1
    RUN_S(snip_load); ASSERT_EQ(a0, CAUSE_LOAD_PAGE); ASSERT_EQ_REG(a1, s3)
    TEST_BEGIN(27)                   /* with MXR it reads the code */
    li t0, MSTATUS_MXR; csrs mstatus, t0
    mv a2, s3; RUN_S(snip_load); EXPECT_OK_S
    la a0, snip_ecall; ld a0, 0(a0); ASSERT_EQ_REG(a3, a0)
    TEST_BEGIN(28)                   /* MXR does not allow stores */
    mv a2, s3; RUN_S(snip_store); ASSERT_EQ(a0, CAUSE_STORE_PAGE)
    li t0, MSTATUS_MXR; csrc mstatus, t0

    /* ---- user pages, SUM */
    TEST_BEGIN(29); U_LOAD(VA(P_URW) + 0x20); EXPECT_OK_U; ASSERT_EQ(a3, 0x3333333333333333)
    TEST_BEGIN(30); U_STORE(VA(P_URW) + 0x28, 0x4444); EXPECT_OK_U
    li a0, PAGES + 0x3028; ld a0, 0(a0); ASSERT_EQ(a0, 0x4444)
    TEST_BEGIN(31); U_LOAD(VA(P_RW) + 0x10); EXPECT_FAULT(CAUSE_LOAD_PAGE, VA(P_RW) + 0x10)
    TEST_BEGIN(32); U_STORE(VA(P_RW) + 0x10, 5); EXPECT_FAULT(CAUSE_STORE_PAGE, VA(P_RW) + 0x10)
    TEST_BEGIN(33)                   /* U fetch from an S page */
    li a0, MODE_U; la a1, snip_ecall; mv s3, a1; call run_in_mode
    ASSERT_EQ(a0, CAUSE_FETCH_PAGE); ASSERT_EQ_REG(a1, s3)
    TEST_BEGIN(34); S_LOAD(VA(P_URW) + 0x20); EXPECT_FAULT(CAUSE_LOAD_PAGE, VA(P_URW) + 0x20)
    TEST_BEGIN(35); S_STORE(VA(P_URW) + 0x20, 1); EXPECT_FAULT(CAUSE_STORE_PAGE, VA(P_URW) + 0x20)
    TEST_BEGIN(36)                   /* SUM = 1: S may load and store U pages */
    li t0, MSTATUS_SUM; csrs mstatus, t0
    S_LOAD(VA(P_URW) + 0x20); EXPECT_OK_S; ASSERT_EQ(a3, 0x3333333333333333)
    TEST_BEGIN(37); S_STORE(VA(P_URW) + 0x30, 0x5555); EXPECT_OK_S
    li a0, PAGES + 0x3030; ld a0, 0(a0); ASSERT_EQ(a0, 0x5555)
    TEST_BEGIN(38)                   /* ... but never execute them */
    li a0, MODE_S; la a1, snip_ecall; call to_user_va; mv s3, a1; call run_in_mode
    ASSERT_EQ(a0, CAUSE_FETCH_PAGE); ASSERT_EQ_REG(a1, s3)
    li t0, MSTATUS_SUM; csrc mstatus, t0

    /* ---- A and D bits, updated by the hardware */
    TEST_BEGIN(39); S_LOAD(VA(P_AD)); EXPECT_OK_S
    la a0, pt_l0; ld a0, P_AD * 8(a0); andi a0, a0, PTE_A | PTE_D; ASSERT_EQ(a0, PTE_A)
    TEST_BEGIN(40); S_STORE(VA(P_AD) + 8, 9); EXPECT_OK_S
    la a0, pt_l0; ld a0, P_AD * 8(a0); andi a0, a0, PTE_A | PTE_D; ASSERT_EQ(a0, PTE_A | PTE_D)
    li a0, PAGES + 0x7008; ld a0, 0(a0); ASSERT_EQ(a0, 9)
    TEST_BEGIN(41)                   /* a faulting access sets neither */
    SET_PTE_PA(pt_l0, P_AD, PAGES + 0x7000, PTE_V | PTE_R)
    sfence.vma
    S_STORE(VA(P_AD) + 8, 10); ASSERT_EQ(a0, CAUSE_STORE_PAGE)
    la a0, pt_l0; ld a0, P_AD * 8(a0); andi a0, a0, PTE_D; ASSERT_EQ(a0, 0)

    /* ---- sfence.vma */
    TEST_BEGIN(42); S_LOAD(VA(P_REMAP)); EXPECT_OK_S; ASSERT_EQ(a3, 111)
    TEST_BEGIN(43)                   /* remap, S flushes everything */
    SET_PTE_PA(pt_l0, P_REMAP, PAGES + 0x9000, RW_AD)
    li a2, VA(P_REMAP); RUN_S(snip_flush_load); EXPECT_OK_S; ASSERT_EQ(a3, 222)
    TEST_BEGIN(44)                   /* remap back, S flushes that address */
    SET_PTE_PA(pt_l0, P_REMAP, PAGES + 0x8000, RW_AD)
    li a2, VA(P_REMAP); RUN_S(snip_flush_va_load); EXPECT_OK_S; ASSERT_EQ(a3, 111)
    TEST_BEGIN(45)                   /* unmap, M flushes */
    SET_PTE_PA(pt_l0, P_REMAP, PAGES + 0x8000, 0)
    sfence.vma
    S_LOAD(VA(P_REMAP)); EXPECT_FAULT(CAUSE_LOAD_PAGE, VA(P_REMAP))

    /* ---- a 32-bit instruction whose second half is on an unmapped page:
       mepc = its start, mtval = the start of the missing page */
    TEST_BEGIN(46)
    li a2, VA(P_XCROSS) + 0xffe; RUN_S(snip_jump)
    EXPECT_FAULT(CAUSE_FETCH_PAGE, VA(P_XNONE)); ASSERT_EQ(a5, VA(P_XCROSS) + 0xffe)

    /* ---- MPRV: M-mode loads and stores translated as S */
    TEST_BEGIN(47)
    li t0, MSTATUS_MPP; csrc mstatus, t0
    li t0, (MODE_S << 11) | MSTATUS_MPRV; csrs mstatus, t0
    li a1, VA(P_RW) + 0x10
    ld a0, 0(a1)
    li t0, MSTATUS_MPRV; csrc mstatus, t0
    ASSERT_EQ(a0, 0x5555666677778888)
    TEST_BEGIN(48)                   /* a fault under MPRV */
    li t0, MSTATUS_MPRV; csrs mstatus, t0
    li a1, VA(P_NONE)
    SET_RESUME(1f)
    ld a0, 0(a1)
1:  li t0, MSTATUS_MPRV; csrc mstatus, t0
    ASSERT_TRAP(CAUSE_LOAD_PAGE)
    ASSERT_TVAL(VA(P_NONE))
    TEST_BEGIN(49)                   /* instruction fetch in M is never translated */
    li t0, MSTATUS_MPRV; csrs mstatus, t0
    li t0, MSTATUS_MPP; csrc mstatus, t0
    li t0, MODE_S << 11; csrs mstatus, t0
    nop
    li t0, MSTATUS_MPRV; csrc mstatus, t0
    ASSERT_EQ(x0, 0)

    /* ---- page faults delegated to S: stval */
    TEST_BEGIN(50)
    li t0, (1 << CAUSE_LOAD_PAGE) | (1 << CAUSE_STORE_PAGE)
    csrw medeleg, t0
    GOTO_MODE(MODE_S, 2f)
2:  SET_S_RESUME(1f)
    li a1, VA(P_NONE) + 0x48
    ld a0, 0(a1)
    j fail
1:  BACK_TO_M
    csrw medeleg, zero
    ASSERT_S_TRAP(CAUSE_LOAD_PAGE)
    ASSERT_STVAL(VA(P_NONE) + 0x48)

    /* ---- Sv48 */
    SET_PTE_SYM(pt_root48, 0, pt_root, PTE_V)            /* Sv39 root as level 2 */
    SET_PTE_PA(pt_root48, 1, 0, RW_AD)                    /* 512 GiB page at PA 0 */
    SET_PTE_PA(pt_root48, 2, 0x80000000, RW_AD)           /* misaligned */
    TEST_BEGIN(51)
    la a0, pt_root48
    srli a0, a0, 12
    li a1, SATP_SV48
    or s4, a0, a1
    csrw satp, s4
    sfence.vma
    csrr a0, satp
    ASSERT_EQ_REG(a0, s4)
    TEST_BEGIN(52); S_LOAD(VA(P_RW) + 0x10); EXPECT_OK_S; ASSERT_EQ(a3, 0x5555666677778888)
    TEST_BEGIN(53); S_LOAD(VA_2M + 0x1238); EXPECT_OK_S; ASSERT_EQ(a3, 0x1111222233334444)
    TEST_BEGIN(54); U_LOAD(VA(P_URW) + 0x20); EXPECT_OK_U; ASSERT_EQ(a3, 0x3333333333333333)
    TEST_BEGIN(55)                   /* 512 GiB page: VA 0x80_0000_0000 + PA */
    S_LOAD(0x8000000000 + DATA2M + 0x1238); EXPECT_OK_S; ASSERT_EQ(a3, 0x1111222233334444)
    TEST_BEGIN(56); S_LOAD(0x10000000000 + 0x100); EXPECT_FAULT(CAUSE_LOAD_PAGE, 0x10000000100)
    TEST_BEGIN(57); S_LOAD(VA(P_NONE)); EXPECT_FAULT(CAUSE_LOAD_PAGE, VA(P_NONE))
    TEST_BEGIN(58)                   /* Sv48: bits 63..48 must equal bit 47 */
    S_LOAD(0x800000000000); ASSERT_EQ(a0, CAUSE_LOAD_PAGE)
    TEST_BEGIN(59); S_LOAD(0xffff800000000000); EXPECT_FAULT(CAUSE_LOAD_PAGE, 0xffff800000000000)

    /* ---- sfence.vma with an address in a superpage drops the
       translation of every address in it, not only of that 4 KiB */
    TEST_BEGIN(60)
    li a0, DATA2M + 0x1f8000; li a1, 0x6161; sd a1, 0(a0)
    li a0, PAGES + 0x1f8000; li a1, 0x6262; sd a1, 0(a0)
    S_LOAD(VA_2M + 0x1f8000); EXPECT_OK_S; ASSERT_EQ(a3, 0x6161)
    TEST_BEGIN(61)                   /* the 2 MiB page moved; S flushes another address in it */
    SET_PTE_PA(pt_l1, 0, PAGES, RW_AD)
    li a2, VA_2M + 0x1f8000; li a4, VA_2M + 0x5000; RUN_S(snip_flush_other_load)
    EXPECT_OK_S; ASSERT_EQ(a3, 0x6262)
    SET_PTE_PA(pt_l1, 0, DATA2M, RW_AD)
    sfence.vma

    /* ---- back to Bare */
    TEST_BEGIN(62)
    csrw satp, zero
    sfence.vma
    li a2, PAGES + 0x10; RUN_S(snip_load); EXPECT_OK_S; ASSERT_EQ(a3, 0x5555666677778888)

    PASS

/* ------------------------------------------------------------ helpers */
/* a0 = table, a1 = index, a2 = physical address, a3 = flags */
set_pte:
    srli a2, a2, 12
    slli a2, a2, 10
    or a2, a2, a3
    slli a1, a1, 3
    add a0, a0, a1
    sd a2, 0(a0)
    ret
/* a1 = address in the snippet page -> same offset in the U page / XO page */
to_user_va:
    la t0, snip_page
    sub a1, a1, t0
    li t0, VA(P_UX)
    add a1, a1, t0
    ret
to_xo_va:
    la t0, snip_page
    sub a1, a1, t0
    li t0, VA(P_XO)
    add a1, a1, t0
    ret
/* a0 = mode, a1 = entry; returns a0 = mcause, a1 = mtval, a5 = mepc */
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
    li a3, 0
    mret
1:  la t1, trap_area
    ld a0, TA_CAUSE(t1)
    ld a1, TA_TVAL(t1)
    ld a5, TA_EPC(t1)
    ret

/* snippets: position independent, run in S or U at any alias */
    .balign 4096
snip_page:
snip_load:
    ld a3, 0(a2)
    ecall
snip_store:
    sd a4, 0(a2)
    ecall
snip_jump:
    jr a2
snip_ecall:
    ecall
    nop
snip_flush_load:
    sfence.vma
    ld a3, 0(a2)
    ecall
snip_flush_va_load:
    sfence.vma a2
    ld a3, 0(a2)
    ecall
snip_flush_other_load:
    sfence.vma a4
    ld a3, 0(a2)
    ecall
    .balign 4096

    .data
    .balign 8
vdata:  .dword 0x0f0f0f0f0f0f0f0f

    .bss
    .balign 4096
pt_root:    .skip 4096
pt_l1:      .skip 4096
pt_l0:      .skip 4096
pt_root48:  .skip 4096
pt_end:
