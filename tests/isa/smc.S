# qemu: skip (QEMU runs the stale bits here, which the spec allows)
# Self-modifying code without fence.i: a store rewrites a later
# instruction of the straight line of code it belongs to.
#
# The spec lets a hart run the old bits until it executes fence.i. ftvm
# promises more, for determinism: every instruction runs as the bits in
# memory are when it is reached. ftvm decodes straight lines of code as
# blocks and cuts a block at a store into its own bytes; if it did not,
# which bits ran would depend on where the block began, and so on how the
# run was split into slices, and a replay could diverge from its record.
#include "common.h"

    .text
test_main:
    /* ---- the rewritten instruction runs the first time the code runs,
       and when it runs again from the block cache */
    TEST_BEGIN(1)
    la a1, codebuf
    li a0, 0x00c5a423          /* sw a2, 8(a1) */
    sw a0, 0(a1)
    li a0, 0x00000013          /* nop */
    sw a0, 4(a1)
    li a0, 0x00100513          /* addi a0, zero, 1 */
    sw a0, 8(a1)
    li a0, 0x00008067          /* jalr zero, 0(ra) */
    sw a0, 12(a1)
    fence.i
    li a2, 0x00300513          /* addi a0, zero, 3 */
    jalr ra, 0(a1)
    ASSERT_EQ(a0, 3)
    TEST_BEGIN(2)
    la a1, codebuf
    li a0, 0x00100513          /* addi a0, zero, 1, as when first run */
    sw a0, 8(a1)
    fence.i
    li a2, 0x00400513          /* addi a0, zero, 4 */
    jalr ra, 0(a1)
    ASSERT_EQ(a0, 4)

    PASS

    .data
    .balign 8
codebuf: .skip 16
