/*
 * The guest of the in-process fault-tolerance tests (ft_inprocess.rs): a
 * bare-metal RV64 program, one hart in M-mode, no firmware, that talks to
 * a client over virtio-net (slot 0) and writes what it does on the UART.
 *
 * Each round it computes (about 150,000 instructions, so the primary's
 * log and checkpoints have something to cover), transmits a frame
 * carrying its sequence number (2 * round), its running hash and the
 * nonce of the last frame it received, waits (polling) for the client's
 * reply, and echoes the reply's nonce at once in a second frame (2 *
 * round + 1). So every frame but the first depends on an input, the echo
 * on one received a few instructions before: a backup that went live
 * without that input could not send it, which is what the Output Rule is
 * about. After ROUNDS rounds it powers off through the SiFive test device.
 *
 * Built by the test with riscv64-linux-gnu-gcc (-nostdlib, link.ld).
 */
#include <stdint.h>

#define UART 0x10000000UL
#define SYSCON 0x100000UL
#define NET 0x10001000UL /* virtio slot 0 */
#define ROUNDS 12
#define WORK 6000 /* loop turns of the computation per round */
#define QSZ 8

typedef volatile uint32_t v32;
#define REG(off) (*(v32 *)(NET + (off)))

struct desc { uint64_t addr; uint32_t len; uint16_t flags; uint16_t next; };
struct avail { uint16_t flags; uint16_t idx; uint16_t ring[QSZ]; };
struct used_elem { uint32_t id; uint32_t len; };
struct used { uint16_t flags; uint16_t idx; struct used_elem ring[QSZ]; };

struct queue {
    struct desc desc[QSZ] __attribute__((aligned(16)));
    struct avail avail __attribute__((aligned(2)));
    struct used used __attribute__((aligned(4)));
    uint16_t last_used;
};

static struct queue rxq __attribute__((aligned(4096)));
static struct queue txq __attribute__((aligned(4096)));
static uint8_t rxbuf[QSZ][1536];
static uint8_t txbuf[1536];
static uint32_t scratch[4096];

static void putc_(char c) { *(volatile uint8_t *)UART = (uint8_t)c; }
static void puts_(const char *s) { while (*s) putc_(*s++); }
static void puthex(uint64_t v) {
    for (int i = 60; i >= 0; i -= 4) putc_("0123456789abcdef"[(v >> i) & 15]);
}

static void fence(void) { __asm__ volatile("fence" ::: "memory"); }

static void setup_queue(int sel, struct queue *q) {
    REG(0x030) = sel;
    REG(0x038) = QSZ;
    uint64_t d = (uint64_t)q->desc, a = (uint64_t)&q->avail, u = (uint64_t)&q->used;
    REG(0x080) = (uint32_t)d; REG(0x084) = (uint32_t)(d >> 32);
    REG(0x090) = (uint32_t)a; REG(0x094) = (uint32_t)(a >> 32);
    REG(0x0a0) = (uint32_t)u; REG(0x0a4) = (uint32_t)(u >> 32);
    REG(0x044) = 1;
}

static void post_rx(int i) {
    rxq.desc[i].addr = (uint64_t)rxbuf[i];
    rxq.desc[i].len = sizeof rxbuf[i];
    rxq.desc[i].flags = 2; /* device-writable */
    rxq.avail.ring[rxq.avail.idx % QSZ] = i;
    fence();
    rxq.avail.idx++;
    fence();
    REG(0x050) = 0;
}

static void transmit(const uint8_t *frame, uint32_t len) {
    for (uint32_t i = 0; i < 12; i++) txbuf[i] = 0; /* virtio_net_hdr_v1 */
    for (uint32_t i = 0; i < len; i++) txbuf[12 + i] = frame[i];
    int i = txq.avail.idx % QSZ;
    txq.desc[i].addr = (uint64_t)txbuf;
    txq.desc[i].len = 12 + len;
    txq.desc[i].flags = 0;
    txq.avail.ring[i] = i;
    fence();
    txq.avail.idx++;
    fence();
    REG(0x050) = 1;
    while (*(volatile uint16_t *)&txq.used.idx == txq.last_used) {}
    txq.last_used++;
}

/* Waits for the next received frame; returns its nonce (payload bytes 0-7). */
static uint64_t receive(void) {
    while (*(volatile uint16_t *)&rxq.used.idx == rxq.last_used) {}
    fence();
    struct used_elem e = rxq.used.ring[rxq.last_used % QSZ];
    rxq.last_used++;
    uint8_t *p = rxbuf[e.id] + 12 + 14;
    uint64_t nonce = 0;
    for (int i = 7; i >= 0; i--) nonce = (nonce << 8) | p[i];
    post_rx(e.id);
    return nonce;
}

static void put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }

void main(void) {
    puts_("guest: start\n");
    REG(0x070) = 0;
    REG(0x070) = 1;
    REG(0x070) = 1 | 2;
    REG(0x024) = 1; REG(0x020) = 1; /* VIRTIO_F_VERSION_1 (bit 32) */
    REG(0x024) = 0; REG(0x020) = 0;
    REG(0x070) = 1 | 2 | 8;
    setup_queue(0, &rxq);
    setup_queue(1, &txq);
    REG(0x070) = 1 | 2 | 8 | 4;
    for (int i = 0; i < QSZ; i++) post_rx(i);

    uint64_t hash = 0xcbf29ce484222325ULL, nonce = 0;
    uint8_t frame[64];
    for (uint64_t round = 1; round <= ROUNDS; round++) {
        for (uint32_t i = 0; i < WORK; i++) {
            uint32_t k = (uint32_t)(hash >> 7) % 4096;
            scratch[k] += (uint32_t)hash;
            hash = (hash ^ scratch[(k * 7) % 4096] ^ i) * 0x100000001b3ULL;
        }
        for (int i = 0; i < 6; i++) frame[i] = 0xff;
        for (int i = 0; i < 6; i++) frame[6 + i] = (uint8_t)(0x52 + i);
        frame[12] = 0x88; frame[13] = 0xb5;
        put64(frame + 14, 2 * round);
        put64(frame + 22, hash);
        put64(frame + 30, nonce);
        for (int i = 38; i < 60; i++) frame[i] = 0;
        puts_("guest: round "); puthex(round); puts_(" hash "); puthex(hash); puts_(" nonce "); puthex(nonce); putc_('\n');
        transmit(frame, 60);
        nonce = receive();
        hash ^= nonce;
        put64(frame + 14, 2 * round + 1);
        put64(frame + 30, nonce);
        transmit(frame, 60);
    }
    puts_("guest: done\n");
    *(volatile uint32_t *)SYSCON = 0x5555;
    for (;;) {}
}
