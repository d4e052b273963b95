/* The guest CPU job of bench/vs-qemu without the kernel: SHA-256 of
   64 MiB of zeros, produced 1 MiB at a time into a buffer (what dd does)
   and hashed from it (what sha256sum does). Prints the digest on the
   UART and exits 0 if it is the known one. Machine mode, no paging, no
   interrupts: only the interpreter's speed is measured. */

#include <stdint.h>

#define UART ((volatile uint8_t *)0x10000000)
#define MIB (1024 * 1024)
#define BLOCKS 64

static uint8_t buf[MIB];

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static inline uint32_t ror(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void compress(uint32_t h[8], const uint8_t *p) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = hh + (ror(e, 6) ^ ror(e, 11) ^ ror(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i];
        uint32_t t2 = (ror(a, 2) ^ ror(a, 13) ^ ror(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        hh = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
    }
    h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += hh;
}

static void put(char c) {
    while (!(UART[5] & 0x20)) {
    }
    UART[0] = c;
}

int main(void) {
    uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    for (int blk = 0; blk < BLOCKS; blk++) {
        /* volatile stores: the compiler may not turn the fill into a
           library call or drop it. */
        volatile uint64_t *q = (volatile uint64_t *)buf;
        for (int i = 0; i < MIB / 8; i++)
            q[i] = 0;
        for (int off = 0; off < MIB; off += 64)
            compress(h, buf + off);
    }
    uint8_t pad[64] = {0x80};
    uint64_t bits = (uint64_t)BLOCKS * MIB * 8;
    for (int i = 0; i < 8; i++)
        pad[63 - i] = bits >> (8 * i);
    compress(h, pad);
    static const char hex[] = "0123456789abcdef";
    /* sha256 of 64 MiB of zeros, as `dd if=/dev/zero bs=1M count=64 | sha256sum` prints it */
    static const char want[] = "3b6a07d0d404fab4e23b6d34bc6696a6a312dd92821332385e5af7c01c421351";
    int bad = 0;
    for (int i = 0; i < 32; i++) {
        char hi = hex[(h[i / 4] >> (28 - 8 * (i % 4))) & 15], lo = hex[(h[i / 4] >> (24 - 8 * (i % 4))) & 15];
        put(hi);
        put(lo);
        bad |= hi != want[2 * i] || lo != want[2 * i + 1];
    }
    put('\n');
    return bad;
}
