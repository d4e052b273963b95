# cpus: 2
# Two harts: both start at the entry with a0 = their hart id; hart 1
# sleeps in wfi until hart 0 sends an IPI through the CLINT msip, sees the
# data hart 0 wrote before the IPI, then both harts increment shared
# counters with amoadd and with lr/sc loops; the final counts must be exact.
# Run with 2 harts (QEMU -smp 2, ftvm --cpus 2); with one hart the test
# fails at check 2 instead of hanging.
#define NUM_HARTS 2
#include "common.h"

#define N 20000                     /* increments per hart and per counter */
#define TIMEOUT 20000000            /* mtime ticks: 2 s */

/* wait until the dword at label equals val, or fail after TIMEOUT */
#define WAIT_FOR(label, val) \
    li t0, CLINT_MTIME; ld t2, 0(t0); li t1, TIMEOUT; add t2, t2, t1; \
    7796: la t1, label; ld t1, 0(t1); li t6, val; MUTATE_T6; mv t5, t1; beq t1, t6, 7797f; \
    ld t1, 0(t0); bltu t1, t2, 7796b; j fail; 7797: fence rw, rw

    .text
test_main:
    bnez tp, hart1

    /* ---------------------------------------------------------- hart 0 */
    TEST_BEGIN(1); csrr a0, mhartid; TRAP_FIELD(a1, TA_BOOT_A0); ASSERT_EQ(a0, 0); ASSERT_EQ(a1, 0)
    TEST_BEGIN(2); WAIT_FOR(arrived, 1)     /* hart 1 is up and about to sleep */
    TEST_BEGIN(3)                           /* hart 1 knows it is hart 1 */
    la a0, h1_id; ld a0, 0(a0); ASSERT_EQ(a0, 1)
    la a0, h1_a0; ld a0, 0(a0); ASSERT_EQ(a0, 1)
    /* publish data, then wake hart 1 */
    la a0, message
    li a1, 0xfeedface12345678
    sd a1, 0(a0)
    fence w, w
    li a0, CLINT_MSIP + 4
    li a1, 1
    sw a1, 0(a0)
    call work
    TEST_BEGIN(4); WAIT_FOR(done, 2)
    TEST_BEGIN(5); ASSERT_MEM_D(ack, 0xfeedface12345678)  /* hart 1 saw the data */
    TEST_BEGIN(6); ASSERT_MEM_D(woke_by_msip, 1)          /* and the IPI in mip */
    TEST_BEGIN(7); ASSERT_MEM_D(cnt_amo, 2 * N)
    TEST_BEGIN(8); ASSERT_MEM_D(cnt_lrsc, 2 * N)
    TEST_BEGIN(9); la a0, cnt_amow; lw a0, 0(a0); ASSERT_EQ(a0, 2 * N)
    TEST_BEGIN(10)                           /* hart 1 cleared its msip */
    li a0, CLINT_MSIP + 4; lw a0, 0(a0); ASSERT_EQ(a0, 0)
    TEST_BEGIN(11)                           /* hart 0's msip was never set */
    li a0, CLINT_MSIP; lw a0, 0(a0); ASSERT_EQ(a0, 0)
    PASS

    /* ---------------------------------------------------------- hart 1 */
hart1:
    csrr a0, mhartid
    la a1, h1_id
    sd a0, 0(a1)
    TRAP_FIELD(a0, TA_BOOT_A0 + TA_SIZE)
    la a1, h1_a0
    sd a0, 0(a1)
    li t0, 1 << IRQ_MSI
    csrw mie, t0                    /* enabled locally, MIE = 0: wfi wakes, no trap */
    la a0, arrived
    li a1, 1
    amoswap.d.rl zero, a1, (a0)     /* after h1_id / h1_a0 */
1:  wfi
    csrr a0, mip
    andi a0, a0, 1 << IRQ_MSI
    beqz a0, 1b
    la a1, woke_by_msip
    li a0, 1
    sd a0, 0(a1)
    li a0, CLINT_MSIP + 4
    sw zero, 0(a0)
    fence rw, rw
    la a0, message
    ld a0, 0(a0)
    la a1, ack
    sd a0, 0(a1)
    call work
2:  wfi
    j 2b

/* both harts: N increments of each counter, then done += 1 */
work:
    li a5, N
    la a1, cnt_amo
    la a2, cnt_lrsc
    la a3, cnt_amow
    li a4, 1
1:  amoadd.d zero, a4, (a1)
    amoadd.w zero, a4, (a3)
2:  lr.d a0, (a2)
    addi a0, a0, 1
    sc.d a0, a0, (a2)
    bnez a0, 2b
    addi a5, a5, -1
    bnez a5, 1b
    fence rw, rw
    la a1, done
    amoadd.d zero, a4, (a1)
    ret

    .data
    .balign 64
arrived:        .dword 0
    .balign 64
message:        .dword 0
    .balign 64
ack:            .dword 0
woke_by_msip:   .dword 0
h1_id:          .dword -1
h1_a0:          .dword -1
    .balign 64
cnt_amo:        .dword 0
    .balign 64
cnt_lrsc:       .dword 0
    .balign 64
cnt_amow:       .dword 0
    .balign 64
done:           .dword 0
