# RV64I base integer instructions: arithmetic, logic, shifts (including
# the W forms), lui/auipc, branches, jal/jalr, loads/stores, x0, fence.i.
#include "common.h"

/* branch taken: must reach the target */
#define TEST_BR_TAKEN(n, op, a, b) \
    TEST_BEGIN(n); li a1, a; li a2, b; op a1, a2, 7780f; li t5, 0; li t6, 1; j fail; \
    7780: MUTATE_FAIL
/* branch not taken: must fall through */
#define TEST_BR_NOT(n, op, a, b) \
    TEST_BEGIN(n); li a1, a; li a2, b; op a1, a2, 7781f; j 7782f; \
    7781: li t5, 1; li t6, 0; j fail; 7782: MUTATE_FAIL

    .text
test_main:
    /* ---- add / sub / addi */
    TEST_RR(1, add, 0, 0, 0)
    TEST_RR(2, add, 2, 1, 1)
    TEST_RR(3, add, 10, 3, 7)
    TEST_RR(4, add, 0x8000000000000000, 0x7fffffffffffffff, 1)
    TEST_RR(5, add, 0, -1, 1)
    TEST_RR(6, add, 0x100000000, 0xffffffff, 1)
    TEST_RR(7, sub, 0, 0, 0)
    TEST_RR(8, sub, -1, 1, 2)
    TEST_RR(9, sub, 0x7fffffffffffffff, 0x8000000000000000, 1)
    TEST_RI(10, addi, 4, 5, -1)
    TEST_RI(11, addi, 0x8000000000000000, 0x7fffffffffffffff, 1)
    TEST_RI(12, addi, 2047, 0, 2047)
    TEST_RI(13, addi, -2048, 0, -2048)
    /* ---- addw / subw / addiw: 32-bit result, sign-extended */
    TEST_RR(14, addw, 0xffffffff80000000, 0x7fffffff, 1)
    TEST_RR(15, addw, 0, 0xffffffff, 1)
    TEST_RR(16, addw, 8, 0x100000005, 0x200000003)
    TEST_RR(17, subw, -1, 0, 1)
    TEST_RR(18, subw, 0x7fffffff, 0x80000000, 1)
    TEST_RR(19, subw, 0, 0x100000000, 0)
    TEST_RI(20, addiw, 0xffffffff80000000, 0x7fffffff, 1)
    TEST_RI(21, addiw, 0x7fffffff, 0xffffffff80000000, -1)
    TEST_RI(22, addiw, 0x23456789, 0x123456789, 0)
    TEST_RI(23, addiw, 0xfffffffff0000000, 0xf0000000, 0)
    /* ---- logic */
    TEST_RR(24, and, 0x0f000f000f000f00, 0xff00ff00ff00ff00, 0x0ff00ff00ff00ff0)
    TEST_RR(25, or,  0xfff0fff0fff0fff0, 0xff00ff00ff00ff00, 0x0ff00ff00ff00ff0)
    TEST_RR(26, xor, 0xf0f0f0f0f0f0f0f0, 0xff00ff00ff00ff00, 0x0ff00ff00ff00ff0)
    TEST_RI(27, andi, 0x0123456789abcde0, 0x0123456789abcdef, -16)
    TEST_RI(28, andi, 0x700, 0xff00ff00ff00ff00, 0x70f)
    TEST_RI(29, ori, -1, 0, -1)
    TEST_RI(30, ori, 0xff00ff00ff00ffff, 0xff00ff00ff00ff00, 0xff)
    TEST_RI(31, xori, 0x00ff00ff00ff00ff, 0xff00ff00ff00ff00, -1)
    TEST_RI(32, xori, 0x6dc, 0x123, 0x7ff)
    /* ---- set less than */
    TEST_RR(33, slt, 0, 0, 0)
    TEST_RR(34, slt, 1, -1, 0)
    TEST_RR(35, slt, 0, 0, -1)
    TEST_RR(36, sltu, 0, -1, 0)
    TEST_RR(37, sltu, 1, 0, -1)
    TEST_RR(38, slt, 1, 0x8000000000000000, 0x7fffffffffffffff)
    TEST_RR(39, sltu, 0, 0x8000000000000000, 0x7fffffffffffffff)
    TEST_RI(40, slti, 1, -5, -4)
    TEST_RI(41, slti, 0, 5, -4)
    TEST_RI(42, sltiu, 1, 5, -1)
    TEST_RI(43, sltiu, 1, 0, 1)
    TEST_RI(44, sltiu, 0, 1, 1)
    /* ---- 64-bit shifts by register (low 6 bits of rs2 only) */
    TEST_RR(45, sll, 1, 1, 0)
    TEST_RR(46, sll, 0x80000000, 1, 31)
    TEST_RR(47, sll, 0x8000000000000000, 1, 63)
    TEST_RR(48, sll, 0xffffffff00000000, -1, 32)
    TEST_RR(49, sll, 8, 1, 67)
    TEST_RR(50, srl, 0x8000000000000000, 0x8000000000000000, 0)
    TEST_RR(51, srl, 0x100000000, 0x8000000000000000, 31)
    TEST_RR(52, srl, 1, 0x8000000000000000, 63)
    TEST_RR(53, srl, 0x7fffffffffffffff, -1, 65)
    TEST_RR(54, sra, 0x8000000000000000, 0x8000000000000000, 0)
    TEST_RR(55, sra, 0xffffffff00000000, 0x8000000000000000, 31)
    TEST_RR(56, sra, -1, 0x8000000000000000, 63)
    TEST_RR(57, sra, 0, 0x7fffffffffffffff, 63)
    TEST_RR(58, sra, 0xc000000000000000, 0x8000000000000000, 65)
    /* ---- 64-bit shifts by immediate */
    TEST_RI(59, slli, 0x8000000000000000, 1, 63)
    TEST_RI(60, slli, 0x0000000080000000, 1, 31)
    TEST_RI(61, slli, 0x0123456789abcdef, 0x0123456789abcdef, 0)
    TEST_RI(62, srli, 1, 0x8000000000000000, 63)
    TEST_RI(63, srli, 0xffffffff, -1, 32)
    TEST_RI(64, srli, 0x0123456789abcdef, 0x0123456789abcdef, 0)
    TEST_RI(65, srai, -1, 0x8000000000000000, 63)
    TEST_RI(66, srai, -16, -256, 4)
    TEST_RI(67, srai, 1, 0x4000000000000000, 62)
    TEST_RI(68, srai, 0xffffffff00000000, 0x8000000000000000, 31)
    /* ---- 32-bit shifts (low 5 bits of rs2, sign-extended result) */
    TEST_RR(69, sllw, 0xffffffff80000000, 1, 31)
    TEST_RR(70, sllw, 1, 1, 32)
    TEST_RR(71, sllw, 1, 0xffffffff00000001, 0)
    TEST_RR(72, sllw, 0xffffffff80000000, 3, 31)
    TEST_RR(73, srlw, 1, 0x80000000, 31)
    TEST_RR(74, srlw, 0xffffffff80000000, 0xffffffff80000000, 0)
    TEST_RR(75, srlw, 0x7fffffff, 0xffffffff, 1)
    TEST_RR(76, srlw, 0x08000000, 0x180000000, 4)
    TEST_RR(77, srlw, 0x40000000, 0x80000000, 33)
    TEST_RR(78, sraw, -1, 0x80000000, 31)
    TEST_RR(79, sraw, 0xffffffff80000000, 0x80000000, 0)
    TEST_RR(80, sraw, 0, 0x7fffffff, 31)
    TEST_RR(81, sraw, 0xfffffffff8000000, 0x80000000, 4)
    TEST_RR(82, sraw, 0x3fffffff, 0xffffffff7fffffff, 1)
    TEST_RI(83, slliw, 0xffffffff80000000, 1, 31)
    TEST_RI(84, slliw, 0xffffffffffff0000, 0xffffffff0000ffff, 16)
    TEST_RI(85, slliw, 0x12345678, 0xabcdef0012345678, 0)
    TEST_RI(86, srliw, 1, 0xffffffff80000000, 31)
    TEST_RI(87, srliw, -1, -1, 0)
    TEST_RI(88, srliw, 0x7fffffff, -1, 1)
    TEST_RI(89, sraiw, -1, 0x80000000, 31)
    TEST_RI(90, sraiw, 0x7fffffff, 0x7fffffff, 0)
    TEST_RI(91, sraiw, 0xfffffffff8000000, 0x180000000, 4)
    /* ---- register aliasing, x0 as destination */
    TEST_RR_SRC1_EQ_DEST(92, add, 24, 13, 11)
    TEST_RR_SRC2_EQ_DEST(93, sub, 2, 13, 11)
    TEST_RR_SRC12_EQ_DEST(94, add, 26, 13)
    TEST_RR_SRC12_EQ_DEST(95, sub, 0, 13)
    TEST_RR_ZERODEST(96, add, 13, 11)
    TEST_RI_SRC1_EQ_DEST(97, srai, -2, -8, 2)

    /* ---- lui / auipc */
    TEST_BEGIN(98); lui a0, 0; ASSERT_EQ(a0, 0)
    TEST_BEGIN(99); lui a0, 0x7ffff; ASSERT_EQ(a0, 0x7ffff000)
    TEST_BEGIN(100); lui a0, 0x80000; ASSERT_EQ(a0, 0xffffffff80000000)
    TEST_BEGIN(101); lui a0, 0xfffff; ASSERT_EQ(a0, 0xfffffffffffff000)
    TEST_BEGIN(102); lui a0, 0x12345; addi a0, a0, 0x678; ASSERT_EQ(a0, 0x12345678)
    TEST_BEGIN(103)
1:  auipc a0, 0
    la a1, 1b
    ASSERT_EQ_REG(a0, a1)
    TEST_BEGIN(104)
1:  auipc a0, 1
    la a1, 1b
    li t0, 0x1000
    add a1, a1, t0
    ASSERT_EQ_REG(a0, a1)
    TEST_BEGIN(105)
1:  auipc a0, 0x80000          /* offset is sign-extended: pc - 2^31 */
    la a1, 1b
    li t0, -0x80000000
    add a1, a1, t0
    ASSERT_EQ_REG(a0, a1)
    TEST_BEGIN(106)
1:  auipc a0, 0xfffff           /* pc - 4096 */
    la a1, 1b
    addi a1, a1, -2048
    addi a1, a1, -2048
    ASSERT_EQ_REG(a0, a1)

    /* ---- x0 is hardwired to zero */
    TEST_BEGIN(107); addi x0, x0, 5; ASSERT_EQ(x0, 0)
    TEST_BEGIN(108); lui x0, 0x12345; mv a0, x0; ASSERT_EQ(a0, 0)
    TEST_BEGIN(109); la a1, ldata; ld x0, 0(a1); add a0, x0, x0; ASSERT_EQ(a0, 0)
    TEST_BEGIN(110); li a0, 7; add a0, a0, x0; ASSERT_EQ(a0, 7)

    /* ---- branches */
    TEST_BR_TAKEN(111, beq, 1, 1)
    TEST_BR_NOT(112, beq, 1, 2)
    TEST_BR_NOT(113, beq, 0, 0x100000000)
    TEST_BR_TAKEN(114, bne, 1, 2)
    TEST_BR_NOT(115, bne, 3, 3)
    TEST_BR_TAKEN(116, bne, 0, 0x100000000)
    TEST_BR_TAKEN(117, blt, -1, 0)
    TEST_BR_NOT(118, blt, 0, -1)
    TEST_BR_NOT(119, blt, 5, 5)
    TEST_BR_TAKEN(120, blt, 0x8000000000000000, 0)
    TEST_BR_TAKEN(121, bge, 0, -1)
    TEST_BR_TAKEN(122, bge, 5, 5)
    TEST_BR_NOT(123, bge, -1, 0)
    TEST_BR_TAKEN(124, bltu, 0, -1)
    TEST_BR_NOT(125, bltu, -1, 0)
    TEST_BR_NOT(126, bltu, 5, 5)
    TEST_BR_TAKEN(127, bgeu, -1, 0)
    TEST_BR_TAKEN(128, bgeu, 5, 5)
    TEST_BR_NOT(129, bgeu, 0, -1)
    /* backward branch: a loop that runs 10 times */
    TEST_BEGIN(130)
    li a0, 0
    li a1, 10
1:  addi a0, a0, 3
    addi a1, a1, -1
    bnez a1, 1b
    ASSERT_EQ(a0, 30)

    /* ---- jal / jalr */
    TEST_BEGIN(131)
    li ra, 0
    jal ra, 2f
1:  li t5, 0; li t6, 1; j fail      /* return address points here */
2:  la a1, 1b
    ASSERT_EQ_REG(ra, a1)
    TEST_BEGIN(132)                   /* jal x0 does not write */
    j 1f
    j fail
1:  ASSERT_EQ(x0, 0)
    TEST_BEGIN(133)                   /* backward jal */
    li a0, 0
    j 2f
1:  li a0, 5
    j 3f
2:  jal a2, 1b
3:  ASSERT_EQ(a0, 5)
    TEST_BEGIN(134)                   /* jalr rd = pc + 4, target = rs1 + imm */
    la a1, 2f
    jalr a2, 0(a1)
1:  j fail
2:  la a3, 1b
    ASSERT_EQ_REG(a2, a3)
    TEST_BEGIN(135)                   /* jalr clears bit 0 of the target */
    la a1, 2f
    addi a1, a1, 1
    jalr a2, 0(a1)
    j fail
2:  ASSERT_EQ(x0, 0)
    TEST_BEGIN(136)                   /* ... also when the sum of rs1 and imm is odd */
    la a1, 2f
    addi a1, a1, -4
    jalr a2, 5(a1)
    j fail
2:  ASSERT_EQ(x0, 0)
    TEST_BEGIN(137)                   /* negative offset */
    la a1, 2f
    addi a1, a1, 100
    jalr x0, -100(a1)
    j fail
2:  ASSERT_EQ(x0, 0)
    TEST_BEGIN(138)                   /* rd == rs1: target uses the old value */
    la a1, 2f
    jalr a1, 0(a1)
1:  j fail
2:  la a3, 1b
    ASSERT_EQ_REG(a1, a3)

    /* ---- loads: bytes 12 34 56 78 9a bc de f0 at ldata */
    TEST_BEGIN(139); la a1, ldata; lb a0, 0(a1); ASSERT_EQ(a0, 0x12)
    TEST_BEGIN(140); la a1, ldata; lb a0, 7(a1); ASSERT_EQ(a0, 0xfffffffffffffff0)
    TEST_BEGIN(141); la a1, ldata; lbu a0, 7(a1); ASSERT_EQ(a0, 0xf0)
    TEST_BEGIN(142); la a1, ldata; lbu a0, 4(a1); ASSERT_EQ(a0, 0x9a)
    TEST_BEGIN(143); la a1, ldata; lh a0, 0(a1); ASSERT_EQ(a0, 0x3412)
    TEST_BEGIN(144); la a1, ldata; lh a0, 6(a1); ASSERT_EQ(a0, 0xfffffffffffff0de)
    TEST_BEGIN(145); la a1, ldata; lhu a0, 6(a1); ASSERT_EQ(a0, 0xf0de)
    TEST_BEGIN(146); la a1, ldata; lw a0, 0(a1); ASSERT_EQ(a0, 0x78563412)
    TEST_BEGIN(147); la a1, ldata; lw a0, 4(a1); ASSERT_EQ(a0, 0xfffffffff0debc9a)
    TEST_BEGIN(148); la a1, ldata; lwu a0, 4(a1); ASSERT_EQ(a0, 0xf0debc9a)
    TEST_BEGIN(149); la a1, ldata; ld a0, 0(a1); ASSERT_EQ(a0, 0xf0debc9a78563412)
    TEST_BEGIN(150); la a1, ldata + 8; ld a0, -8(a1); ASSERT_EQ(a0, 0xf0debc9a78563412)
    TEST_BEGIN(151); la a1, ldata + 8; lb a0, -1(a1); ASSERT_EQ(a0, 0xfffffffffffffff0)
    TEST_BEGIN(152); la a1, ldata - 2040; lwu a0, 2044(a1); ASSERT_EQ(a0, 0xf0debc9a)
    TEST_BEGIN(153); la a1, ldata; ld a1, 0(a1); ASSERT_EQ(a1, 0xf0debc9a78563412)

    /* ---- stores: each width writes exactly its bytes */
    TEST_BEGIN(154)
    la a1, sdata; li a0, -1; sd a0, 0(a1)
    li a2, 0x1122334455667788; sb a2, 0(a1)
    ld a0, 0(a1); ASSERT_EQ(a0, 0xffffffffffffff88)
    TEST_BEGIN(155)
    sb a2, 7(a1)
    ld a0, 0(a1); ASSERT_EQ(a0, 0x88ffffffffffff88)
    TEST_BEGIN(156)
    sh a2, 2(a1)
    ld a0, 0(a1); ASSERT_EQ(a0, 0x88ffffff7788ff88)
    TEST_BEGIN(157)
    sw a2, 4(a1)
    ld a0, 0(a1); ASSERT_EQ(a0, 0x556677887788ff88)
    TEST_BEGIN(158)
    sd a2, 8(a1)
    ld a0, 8(a1); ASSERT_EQ(a0, 0x1122334455667788)
    ld a0, 0(a1); ASSERT_EQ(a0, 0x556677887788ff88)
    TEST_BEGIN(159)                   /* negative offset, then read back narrow */
    addi a3, a1, 16
    li a0, 0xa5
    sb a0, -3(a3)
    lbu a0, 13(a1); ASSERT_EQ(a0, 0xa5)
    lb a0, 13(a1); ASSERT_EQ(a0, 0xffffffffffffffa5)
    TEST_BEGIN(160)                   /* sw stores the low word of rs2 only */
    li a0, 0xdeadbeef00000000
    sw a0, 8(a1)
    ld a0, 8(a1); ASSERT_EQ(a0, 0x1122a54400000000)

    /* ---- fence / fence.i with modified code */
    TEST_BEGIN(161)
    fence
    fence rw, rw
    fence.i
    la a1, codebuf
    li a0, 0x00100513          /* addi a0, zero, 1 */
    sw a0, 0(a1)
    li a0, 0x00008067          /* jalr zero, 0(ra) */
    sw a0, 4(a1)
    fence.i
    li a0, 0
    jalr ra, 0(a1)
    ASSERT_EQ(a0, 1)
    TEST_BEGIN(162)
    la a1, codebuf
    li a0, 0x00200513          /* addi a0, zero, 2 */
    sw a0, 0(a1)
    fence.i
    jalr ra, 0(a1)
    ASSERT_EQ(a0, 2)

    PASS

    .data
    .balign 8
ldata:  .dword 0xf0debc9a78563412
sdata:  .dword 0, 0
    .balign 8
codebuf: .skip 16
