# RV64C: every RV64 compressed instruction, checked by its result;
# c.addiw in the encoding that is c.jal on RV32; c.ebreak and the all-zero
# illegal instruction via traps; 16- and 32-bit instructions mixed at
# 2-byte alignment, including a 32-bit instruction that straddles a 4-byte
# boundary and one that straddles a 4 KiB page boundary.
#include "common.h"

    .text
    .option rvc
test_main:
    /* ---- c.li / c.lui / c.addi / c.addiw / c.nop */
    TEST_BEGIN(1); li a0, 5; c.li a0, -32; ASSERT_EQ(a0, -32)
    TEST_BEGIN(2); c.li a0, 31; ASSERT_EQ(a0, 31)
    TEST_BEGIN(3); c.li s1, 0; ASSERT_EQ(s1, 0)
    TEST_BEGIN(4); c.lui a0, 1; ASSERT_EQ(a0, 0x1000)
    TEST_BEGIN(5); c.lui a0, 0x1f; ASSERT_EQ(a0, 0x1f000)
    TEST_BEGIN(6); c.lui a0, 0xfffe0; ASSERT_EQ(a0, 0xfffffffffffe0000)
    TEST_BEGIN(7); c.lui a5, 0xfffff; ASSERT_EQ(a5, 0xfffffffffffff000)
    TEST_BEGIN(8); li a0, 10; c.addi a0, -11; ASSERT_EQ(a0, -1)
    TEST_BEGIN(9); li a0, 0x7fffffffffffffff; c.addi a0, 31; ASSERT_EQ(a0, 0x800000000000001e)
    TEST_BEGIN(10); li a0, 7; c.nop; c.addi a0, 1; ASSERT_EQ(a0, 8)
    /* c.addiw occupies the RV32 c.jal encoding: no jump, ra untouched */
    TEST_BEGIN(11)
    li ra, 0x1234
    li a0, 0x7fffffff
    c.addiw a0, 1
    ASSERT_EQ(a0, 0xffffffff80000000)
    ASSERT_EQ(ra, 0x1234)
    TEST_BEGIN(12); li a0, 0x180000000; c.addiw a0, 0; ASSERT_EQ(a0, 0xffffffff80000000)
    TEST_BEGIN(13); li a0, 0x100000005; c.addiw a0, -6; ASSERT_EQ(a0, -1)
    TEST_BEGIN(14)                   /* same bits as ".half 0x2505" */
    li a0, 0xfffffffe
    .half 0x2505                    /* c.addiw a0, 1 (RV32: c.jal) */
    ASSERT_EQ(a0, 0xffffffffffffffff)

    /* ---- stack-pointer forms */
    TEST_BEGIN(15)
    mv s0, sp
    c.addi16sp sp, -512
    sub a0, s0, sp
    ASSERT_EQ(a0, 512)
    TEST_BEGIN(16)
    c.addi16sp sp, 496
    sub a0, s0, sp
    ASSERT_EQ(a0, 16)
    c.addi16sp sp, 16
    ASSERT_EQ_REG(sp, s0)
    TEST_BEGIN(17)
    c.addi4spn a0, sp, 4
    sub a0, a0, sp
    ASSERT_EQ(a0, 4)
    TEST_BEGIN(18)
    c.addi4spn a1, sp, 1020
    sub a1, a1, sp
    ASSERT_EQ(a1, 1020)

    /* ---- shifts and immediate logic */
    TEST_BEGIN(19); li a0, 1; c.slli a0, 63; ASSERT_EQ(a0, 0x8000000000000000)
    TEST_BEGIN(20); li t3, 3; c.slli t3, 1; ASSERT_EQ(t3, 6)
    TEST_BEGIN(21); li a0, 0x8000000000000000; c.srli a0, 63; ASSERT_EQ(a0, 1)
    TEST_BEGIN(22); li a0, -1; c.srli a0, 32; ASSERT_EQ(a0, 0xffffffff)
    TEST_BEGIN(23); li a0, 0x8000000000000000; c.srai a0, 63; ASSERT_EQ(a0, -1)
    TEST_BEGIN(24); li a0, -256; c.srai a0, 4; ASSERT_EQ(a0, -16)
    TEST_BEGIN(25); li a0, 0x1234; c.andi a0, 0x1f; ASSERT_EQ(a0, 0x14)
    TEST_BEGIN(26); li a0, 0x1234; c.andi a0, -32; ASSERT_EQ(a0, 0x1220)

    /* ---- register-register */
    TEST_BEGIN(27); li a1, 0x123456789; c.mv a0, a1; ASSERT_EQ(a0, 0x123456789)
    TEST_BEGIN(28); li a0, 5; li t4, 0x100000000; c.add a0, t4; ASSERT_EQ(a0, 0x100000005)
    TEST_BEGIN(29); li s0, 5; li s1, 7; c.sub s0, s1; ASSERT_EQ(s0, -2)
    TEST_BEGIN(30); li a0, 0xff00; li a1, 0x0ff0; c.xor a0, a1; ASSERT_EQ(a0, 0xf0f0)
    TEST_BEGIN(31); li a0, 0xff00; li a1, 0x0ff0; c.or a0, a1; ASSERT_EQ(a0, 0xfff0)
    TEST_BEGIN(32); li a0, 0xff00; li a1, 0x0ff0; c.and a0, a1; ASSERT_EQ(a0, 0x0f00)
    TEST_BEGIN(33); li a0, 0x7fffffff; li a1, 1; c.addw a0, a1; ASSERT_EQ(a0, 0xffffffff80000000)
    TEST_BEGIN(34); li a0, 0x100000000; li a1, 1; c.subw a0, a1; ASSERT_EQ(a0, -1)
    TEST_BEGIN(35); li a0, 0x80000000; li a1, 0x100000000; c.subw a0, a1; ASSERT_EQ(a0, 0xffffffff80000000)

    /* ---- loads and stores, register-based (rs1' in x8..x15) */
    TEST_BEGIN(36); la a1, cdata; c.lw a0, 0(a1); ASSERT_EQ(a0, 0xffffffff89abcdef)
    TEST_BEGIN(37); la a1, cdata; c.lw a0, 4(a1); ASSERT_EQ(a0, 0x01234567)
    TEST_BEGIN(38); la a1, cdata; c.ld a0, 0(a1); ASSERT_EQ(a0, 0x0123456789abcdef)
    TEST_BEGIN(39); la a1, cdata - 120; c.lw a0, 124(a1); ASSERT_EQ(a0, 0x01234567)
    TEST_BEGIN(40); la a1, cdata - 248; c.ld a0, 248(a1); ASSERT_EQ(a0, 0x0123456789abcdef)
    TEST_BEGIN(41)
    la a1, cbuf; li a0, 0x1122334455667788; c.sd a0, 8(a1)
    li a2, 0xaabbccdd; c.sw a2, 12(a1)
    ld a3, 8(a1); ASSERT_EQ(a3, 0xaabbccdd55667788)
    TEST_BEGIN(42)
    la a1, cbuf - 200; li a0, 77; c.sd a0, 248(a1)
    la a1, cbuf; ld a3, 48(a1); ASSERT_EQ(a3, 77)
    TEST_BEGIN(43)
    la a1, cbuf - 100; li a0, -2; c.sw a0, 124(a1)
    la a1, cbuf; lwu a3, 24(a1); ASSERT_EQ(a3, 0xfffffffe)
    /* ---- loads and stores, sp-based */
    TEST_BEGIN(44)
    mv s0, sp
    la sp, cbuf
    li a0, 0x0102030405060708
    c.sdsp a0, 16(sp)
    c.ldsp a4, 16(sp)
    ASSERT_EQ(a4, 0x0102030405060708)
    TEST_BEGIN(45)
    li a0, 0x80000001
    c.swsp a0, 20(sp)
    c.lwsp a4, 20(sp)
    ASSERT_EQ(a4, 0xffffffff80000001)
    c.ldsp a4, 16(sp)
    ASSERT_EQ(a4, 0x8000000105060708)
    TEST_BEGIN(46)
    la sp, cbuf - 496
    li a0, 99
    c.sdsp a0, 504(sp)
    c.ldsp t3, 504(sp)
    ASSERT_EQ(t3, 99)
    la a1, cbuf; ld a3, 8(a1); ASSERT_EQ(a3, 99)
    TEST_BEGIN(47)
    la sp, cbuf - 232
    li a0, 98
    c.swsp a0, 252(sp)
    c.lwsp t3, 252(sp)
    ASSERT_EQ(t3, 98)
    mv sp, s0
    /* ---- floating-point loads and stores */
    TEST_BEGIN(48)
    la a1, cdata
    c.fld fa0, 0(a1)
    fmv.x.d a0, fa0
    ASSERT_EQ(a0, 0x0123456789abcdef)
    la a2, cbuf
    c.fsd fa0, 32(a2)
    ld a0, 32(a2)
    ASSERT_EQ(a0, 0x0123456789abcdef)
    TEST_BEGIN(49)
    mv s0, sp
    la sp, cbuf
    li a0, 0x4000000000000000
    fmv.d.x fa5, a0
    c.fsdsp fa5, 40(sp)
    c.fldsp fa4, 40(sp)
    mv sp, s0
    fmv.x.d a0, fa4
    ASSERT_EQ(a0, 0x4000000000000000)

    /* ---- jumps and branches */
    TEST_BEGIN(50)
    li a0, 0
    c.j 1f
    li a0, 1
1:  ASSERT_EQ(a0, 0)
    TEST_BEGIN(51)                   /* backward c.j */
    li a0, 0
    j 2f
1:  li a0, 9
    c.j 3f
2:  c.j 1b
3:  ASSERT_EQ(a0, 9)
    TEST_BEGIN(52)
    la a1, 1f
    li a0, 0
    c.jr a1
    li a0, 1
1:  ASSERT_EQ(a0, 0)
    TEST_BEGIN(53)                   /* c.jalr: ra = address + 2 */
    la a1, 2f
    c.jalr a1
1:  j fail
2:  la a2, 1b
    ASSERT_EQ_REG(ra, a2)
    TEST_BEGIN(54)
    li s0, 0; li a0, 0
    c.beqz s0, 1f
    li a0, 1
1:  ASSERT_EQ(a0, 0)
    TEST_BEGIN(55)
    li s0, 1; li a0, 0
    c.beqz s0, 1f
    li a0, 1
1:  ASSERT_EQ(a0, 1)
    TEST_BEGIN(56)
    li s1, 0x100000000; li a0, 0
    c.bnez s1, 1f
    li a0, 1
1:  ASSERT_EQ(a0, 0)
    TEST_BEGIN(57)
    li s1, 0; li a0, 0
    c.bnez s1, 1f
    li a0, 1
1:  ASSERT_EQ(a0, 1)
    TEST_BEGIN(58)                   /* backward compressed branch loop */
    li a0, 0; li s1, 5
1:  c.addi a0, 2
    c.addi s1, -1
    c.bnez s1, 1b
    ASSERT_EQ(a0, 10)

    /* ---- c.ebreak and the all-zero illegal instruction */
    TEST_TRAP(59, CAUSE_BREAKPOINT, c.ebreak)
    TEST_BEGIN(60)                   /* mtval: 0 or the pc, both legal */
    TRAP_FIELD(a0, TA_TVAL)
    TRAP_FIELD(a1, TA_EPC)
    ASSERT_EQ2_REG(a0, zero, a1)
    TEST_TRAP(61, CAUSE_ILLEGAL, .half 0x0000)
    TEST_BEGIN(62); ASSERT_TVAL(0)
    TEST_BEGIN(63)                   /* illegal at 2 mod 4: mepc exact */
    SET_RESUME(2f)
    .balign 4
    c.nop
1:  .half 0x0000
2:  ASSERT_TRAP(CAUSE_ILLEGAL)
    ASSERT_EPC(1b)
    TEST_BEGIN(64); TRAP_FIELD(a0, TA_EPC); andi a0, a0, 3; ASSERT_EQ(a0, 2)

    /* ---- mixing 16- and 32-bit instructions at 2-byte alignment */
    TEST_BEGIN(65)
    li a0, 0
    .balign 4
    c.addi a0, 1
    .option norvc
    addi a0, a0, 100                /* 32-bit, straddles a 4-byte boundary */
    .option rvc
    c.addi a0, 2
    .option norvc
    addi a0, a0, 200                /* again */
    lui a1, 0x12345                 /* aligned this time */
    .option rvc
    ASSERT_EQ(a0, 303)
    TEST_BEGIN(66)                   /* branch and jump to 32-bit at 2 mod 4 */
    li a0, 0
    .balign 4
    c.nop
    .option norvc
    beq zero, zero, 1f
    .option rvc
    c.nop
1:  .option norvc
    addi a0, a0, 1
    jal ra, 2f
    .option rvc
    c.nop
2:  .option norvc
    addi a0, a0, 1
    .option rvc
    ASSERT_EQ(a0, 2)
    la a1, 2b
    andi a1, a1, 3
    ASSERT_EQ(a1, 2)
    TEST_BEGIN(67)                   /* jalr to a 2 mod 4 target, return via c.jr */
    la a1, half_func
    andi a2, a1, 3
    ASSERT_EQ(a2, 2)
    li a0, 1
    jalr ra, 0(a1)
    ASSERT_EQ(a0, 43)
    TEST_BEGIN(68)                   /* 32-bit instruction straddling a page */
    la a1, page_cross
    li a2, 0xffe
    and a3, a1, a2
    ASSERT_EQ(a3, 0xffe)
    li a0, 1
    jalr ra, 0(a1)
    ASSERT_EQ(a0, 0x4d3)

    PASS

    .balign 4
    c.nop
half_func:
    .option norvc
    addi a0, a0, 42
    .option rvc
    c.jr ra

    .balign 4096
    .fill 2047, 2, 0x0001           /* c.nop sled up to the page end - 2 */
page_cross:
    .option norvc
    addi a0, a0, 0x4d2              /* bytes 0xffe..0x1001 of the page */
    .option rvc
    c.jr ra

    .data
    .balign 8
cdata:  .dword 0x0123456789abcdef
    .balign 8
cbuf:   .skip 64
