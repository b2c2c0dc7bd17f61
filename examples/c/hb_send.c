/*
 * hb_send: sends heartbeat-monitor heartbeats (wire format v1, docs/wire-format.md).
 *
 * C99 and POSIX libc only, one file:
 *
 *     cc -O2 -Wall -Wextra -o hb_send hb_send.c
 *     ./hb_send --to 192.0.2.1:18498 --id 17 --interval 100
 *     ./hb_send --to 192.0.2.1:18498 --id 17 --auth-key-file /etc/heartbeat/key
 *     ./hb_send --self-test
 *
 * Options (as `monitor send`):
 *   --to ADDR:PORT        the monitor (IPv4, [IPv6] or a host name; required)
 *   --id N                this peer's id, decimal or 0x hex (required)
 *   --interval MS         milliseconds between heartbeats, `100` or `100ms` (default 100)
 *   --count N             stop after N heartbeats (default: until killed)
 *   --incarnation N       sender epoch, must grow across restarts (default: Unix time)
 *   --auth-key-file FILE  sign with the 128-bit key in FILE (32 hex digits, mode 0600)
 *   --dry-run             print each datagram as 64 hex digits instead of sending it
 *   --self-test           check SipHash-2-4 and the encoding against known answers; exit 0/1
 *
 * Heartbeats go out on a fixed schedule (start + k * interval), so one late wake-up does not
 * shift every later heartbeat. A heartbeat sent more than half an interval late is a stall (a
 * stopped process, a paused VM, a starved CPU): the schedule starts again from it, and the
 * missed heartbeats are not sent in a burst, whose near-zero intervals would distort the
 * monitor's window (docs/tuning.md, "A sender after a stall"). Sequence numbers start at 0 in
 * each incarnation and count only heartbeats sent.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <netdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define HB_LEN 32
#define HB_AUTHENTICATED_LEN 24
#define HB_FLAG_AUTH 0x01

/* ---- SipHash-2-4 (Aumasson and Bernstein, 2012) ---- */

#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))

static void sip_round(uint64_t v[4])
{
    v[0] += v[1];
    v[1] = ROTL(v[1], 13);
    v[1] ^= v[0];
    v[0] = ROTL(v[0], 32);
    v[2] += v[3];
    v[3] = ROTL(v[3], 16);
    v[3] ^= v[2];
    v[0] += v[3];
    v[3] = ROTL(v[3], 21);
    v[3] ^= v[0];
    v[2] += v[1];
    v[1] = ROTL(v[1], 17);
    v[1] ^= v[2];
    v[2] = ROTL(v[2], 32);
}

static uint64_t load_le64(const uint8_t *p)
{
    uint64_t x = 0;
    int i;
    for (i = 7; i >= 0; i--)
        x = (x << 8) | p[i];
    return x;
}

/* SipHash-2-4 of msg[0..len) under the key (k0, k1). */
static uint64_t siphash24(uint64_t k0, uint64_t k1, const uint8_t *msg, size_t len)
{
    uint64_t v[4];
    uint64_t m;
    size_t i, full = len - len % 8;
    v[0] = k0 ^ UINT64_C(0x736f6d6570736575);
    v[1] = k1 ^ UINT64_C(0x646f72616e646f6d);
    v[2] = k0 ^ UINT64_C(0x6c7967656e657261);
    v[3] = k1 ^ UINT64_C(0x7465646279746573);
    for (i = 0; i < full; i += 8) {
        m = load_le64(msg + i);
        v[3] ^= m;
        sip_round(v);
        sip_round(v);
        v[0] ^= m;
    }
    /* Last block: the remaining bytes, little-endian, with len mod 256 in the top byte. */
    m = (uint64_t)(len & 0xff) << 56;
    for (i = 0; i < len % 8; i++)
        m |= (uint64_t)msg[full + i] << (8 * i);
    v[3] ^= m;
    sip_round(v);
    sip_round(v);
    v[0] ^= m;
    v[2] ^= 0xff;
    sip_round(v);
    sip_round(v);
    sip_round(v);
    sip_round(v);
    return v[0] ^ v[1] ^ v[2] ^ v[3];
}

/* ---- the heartbeat ---- */

struct key {
    uint64_t k0, k1; /* bytes 0..8 and 8..16 of the key, little-endian */
};

static void put_be(uint8_t *p, uint64_t x, int n)
{
    int i;
    for (i = n - 1; i >= 0; i--) {
        p[i] = (uint8_t)(x & 0xff);
        x >>= 8;
    }
}

/* Encodes one heartbeat; with a key, sets the auth flag and the tag over bytes 0..24. */
static void encode(uint8_t out[HB_LEN], uint64_t id, uint32_t incarnation, uint64_t seq,
                   const struct key *key)
{
    uint64_t tag;
    int i;
    out[0] = 0x48; /* "HB" */
    out[1] = 0x42;
    out[2] = 1; /* version */
    out[3] = key ? HB_FLAG_AUTH : 0;
    put_be(out + 4, incarnation, 4);
    put_be(out + 8, id, 8);
    put_be(out + 16, seq, 8);
    memset(out + 24, 0, 8);
    if (key) {
        tag = siphash24(key->k0, key->k1, out, HB_AUTHENTICATED_LEN);
        for (i = 0; i < 8; i++) /* little-endian, as SipHash emits it */
            out[24 + i] = (uint8_t)(tag >> (8 * i));
    }
}

static int hex_value(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* 32 hex digits -> key; 0 on success. */
static int parse_key(const char *hex, size_t len, struct key *key)
{
    uint8_t bytes[16];
    size_t i;
    int hi, lo;
    if (len != 32)
        return -1;
    for (i = 0; i < 16; i++) {
        hi = hex_value((unsigned char)hex[2 * i]);
        lo = hex_value((unsigned char)hex[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return -1;
        bytes[i] = (uint8_t)(hi << 4 | lo);
    }
    key->k0 = load_le64(bytes);
    key->k1 = load_le64(bytes + 8);
    return 0;
}

static int is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* Reads a key file as `monitor` does: mode 0600 or stricter, 32 hex digits, whitespace around. */
static int read_key_file(const char *path, struct key *key)
{
    struct stat st;
    char text[128];
    size_t n, start = 0;
    FILE *f;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "hb_send: reading auth key file %s: %s\n", path, strerror(errno));
        return -1;
    }
    if (st.st_mode & 077) {
        fprintf(stderr,
                "hb_send: auth key file %s is accessible to group or others (mode %04o); "
                "`chmod 600 %s` and keep it that way\n",
                path, (unsigned)(st.st_mode & 07777), path);
        return -1;
    }
    f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "hb_send: reading auth key file %s: %s\n", path, strerror(errno));
        return -1;
    }
    n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    while (n > 0 && is_space(text[n - 1]))
        n--;
    while (start < n && is_space(text[start]))
        start++;
    if (parse_key(text + start, n - start, key) != 0) {
        fprintf(stderr,
                "hb_send: auth key file %s must hold exactly 32 hexadecimal digits "
                "(a 128-bit key)\n",
                path);
        return -1;
    }
    return 0;
}

/* ---- self-test ---- */

static int check(const char *what, uint64_t got, uint64_t want)
{
    if (got == want)
        return 0;
    fprintf(stderr, "hb_send: self-test %s: got %016llx, want %016llx\n", what,
            (unsigned long long)got, (unsigned long long)want);
    return 1;
}

static int check_bytes(const char *what, const uint8_t *got, const char *want_hex)
{
    char hex[2 * HB_LEN + 1];
    int i;
    for (i = 0; i < HB_LEN; i++)
        snprintf(hex + 2 * i, 3, "%02x", got[i]);
    if (strcmp(hex, want_hex) == 0)
        return 0;
    fprintf(stderr, "hb_send: self-test %s:\n  got  %s\n  want %s\n", what, hex, want_hex);
    return 1;
}

static int self_test(void)
{
    uint8_t msg[64], hb[HB_LEN];
    struct key key;
    int i, failed = 0;
    for (i = 0; i < 64; i++)
        msg[i] = (uint8_t)i;
    key.k0 = load_le64(msg);
    key.k1 = load_le64(msg + 8);
    /* The SipHash paper (Appendix A): key 00..0f, message 00..0e. */
    failed += check("paper, 15 bytes", siphash24(key.k0, key.k1, msg, 15),
                    UINT64_C(0xa129ca6149be45e5));
    /* The reference implementation's vectors.h: messages 00..(len-1), same key. */
    failed += check("vectors.h, 0 bytes", siphash24(key.k0, key.k1, msg, 0),
                    UINT64_C(0x726fdb47dd0e0e31));
    failed += check("vectors.h, 8 bytes", siphash24(key.k0, key.k1, msg, 8),
                    UINT64_C(0x93f5f5799a932462));
    failed += check("vectors.h, 24 bytes (a heartbeat's length)",
                    siphash24(key.k0, key.k1, msg, 24), UINT64_C(0xb8ad50c6f649af94));
    failed += check("vectors.h, 63 bytes", siphash24(key.k0, key.k1, msg, 63),
                    UINT64_C(0x958a324ceb064572));
    /* docs/wire-format.md's example: peer 7, incarnation 1, sequence 42, unauthenticated. */
    encode(hb, 7, 1, 42, NULL);
    failed += check_bytes("unsigned heartbeat", hb,
                          "4842010000000001000000000000000700000000000000"
                          "2a0000000000000000");
    /* The same, signed with key 000102..0f by monitor_common::auth (the Rust sender). */
    if (parse_key("000102030405060708090a0b0c0d0e0f", 32, &key) != 0) {
        fprintf(stderr, "hb_send: self-test: key parsing failed\n");
        failed++;
    }
    encode(hb, 7, 1, 42, &key);
    failed += check_bytes("signed heartbeat", hb,
                          "4842010100000001000000000000000700000000000000"
                          "2a40aad048c3a11742");
    if (failed) {
        fprintf(stderr, "hb_send: self-test: %d check(s) failed\n", failed);
        return 1;
    }
    printf("hb_send: self-test passed\n");
    return 0;
}

/* ---- command line ---- */

static void usage(FILE *out)
{
    fprintf(out,
            "usage: hb_send --to ADDR:PORT --id N [--interval MS] [--count N]\n"
            "               [--incarnation N] [--auth-key-file FILE] [--dry-run]\n"
            "       hb_send --self-test\n");
}

static int parse_u64(const char *text, uint64_t *out)
{
    unsigned long long v;
    char *end;
    int base = 10;
    if (text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) {
        base = 16;
        text += 2;
    }
    /* strtoull accepts a sign and leading blanks: refuse them. */
    if (hex_value((unsigned char)text[0]) < 0 ||
        (base == 10 && hex_value((unsigned char)text[0]) > 9))
        return -1;
    errno = 0;
    v = strtoull(text, &end, base);
    if (errno != 0 || *end != '\0')
        return -1;
    *out = (uint64_t)v;
    return 0;
}

/* "ADDR:PORT", "[ADDR]:PORT" or "HOST:PORT" -> a datagram socket connected to it. */
static int connect_to(const char *to)
{
    char host[256];
    const char *colon = strrchr(to, ':');
    const char *h = to;
    size_t hlen;
    struct addrinfo hints, *res, *ai;
    int fd = -1, rc, err = 0;
    uint64_t port;
    if (!colon || colon == to) {
        fprintf(stderr, "hb_send: --to %s: expected ADDR:PORT (port 1 to 65535)\n", to);
        return -1;
    }
    hlen = (size_t)(colon - to);
    if (to[0] == '[' && colon[-1] == ']') {
        h = to + 1;
        hlen -= 2;
    }
    if (hlen == 0 || hlen >= sizeof host || parse_u64(colon + 1, &port) != 0 || port == 0 ||
        port > 65535 || colon[1] == '0') {
        fprintf(stderr, "hb_send: --to %s: expected ADDR:PORT (port 1 to 65535)\n", to);
        return -1;
    }
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_DGRAM;
    hints.ai_flags = AI_NUMERICSERV;
    rc = getaddrinfo(host, colon + 1, &hints, &res);
    if (rc != 0) {
        fprintf(stderr, "hb_send: --to %s: %s\n", to, gai_strerror(rc));
        return -1;
    }
    for (ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
            break;
        err = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0)
        fprintf(stderr, "hb_send: --to %s: %s\n", to, strerror(err));
    return fd;
}

static void add_ns(struct timespec *t, uint64_t ns)
{
    uint64_t total = (uint64_t)t->tv_nsec + ns % 1000000000u;
    t->tv_sec += (time_t)(ns / 1000000000u + total / 1000000000u);
    t->tv_nsec = (long)(total % 1000000000u);
}

/* Nanoseconds from `a` to `b`, 0 if `b` is not later. */
static uint64_t ns_between(const struct timespec *a, const struct timespec *b)
{
    int64_t ns = (int64_t)(b->tv_sec - a->tv_sec) * 1000000000 + (b->tv_nsec - a->tv_nsec);
    return ns > 0 ? (uint64_t)ns : 0;
}

int main(int argc, char **argv)
{
    const char *to = NULL, *key_file = NULL;
    uint64_t id = 0, interval_ms = 100, count = 0, incarnation, seq, value;
    int have_id = 0, have_count = 0, have_incarnation = 0, dry_run = 0, fd = -1, i;
    struct key key;
    struct timespec due, now;
    uint8_t hb[HB_LEN];

    incarnation = (uint64_t)time(NULL);
    for (i = 1; i < argc; i++) {
        const char *opt = argv[i];
        if (strcmp(opt, "--self-test") == 0)
            return self_test();
        if (strcmp(opt, "--dry-run") == 0) {
            dry_run = 1;
            continue;
        }
        if (strcmp(opt, "--help") == 0 || strcmp(opt, "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "hb_send: %s needs a value (or is unknown)\n", opt);
            usage(stderr);
            return 2;
        }
        const char *arg = argv[++i];
        char number[32];
        size_t len = strlen(arg);
        /* --interval takes milliseconds, with or without an "ms" suffix. */
        if (strcmp(opt, "--interval") == 0 && len > 2 && len < sizeof number &&
            strcmp(arg + len - 2, "ms") == 0) {
            memcpy(number, arg, len - 2);
            number[len - 2] = '\0';
            arg = number;
        }
        if (strcmp(opt, "--to") == 0) {
            to = arg;
        } else if (strcmp(opt, "--auth-key-file") == 0) {
            key_file = arg;
        } else if (parse_u64(arg, &value) != 0) {
            fprintf(stderr, "hb_send: %s %s: not a number (decimal or 0x hex)\n", opt, arg);
            return 2;
        } else if (strcmp(opt, "--id") == 0) {
            id = value;
            have_id = 1;
        } else if (strcmp(opt, "--interval") == 0) {
            interval_ms = value;
        } else if (strcmp(opt, "--count") == 0) {
            count = value;
            have_count = 1;
        } else if (strcmp(opt, "--incarnation") == 0) {
            incarnation = value;
            have_incarnation = 1;
        } else {
            fprintf(stderr, "hb_send: unknown option %s\n", opt);
            usage(stderr);
            return 2;
        }
    }
    if ((!to && !dry_run) || !have_id) {
        fprintf(stderr, "hb_send: --to and --id are required\n");
        usage(stderr);
        return 2;
    }
    if (interval_ms == 0 || interval_ms > UINT64_C(86400000)) {
        fprintf(stderr, "hb_send: --interval must be 1 to 86400000 ms\n");
        return 2;
    }
    if (incarnation > UINT32_MAX) {
        if (have_incarnation) {
            fprintf(stderr, "hb_send: --incarnation must fit in 32 bits\n");
            return 2;
        }
        incarnation = UINT32_MAX;
    }
    if (key_file && read_key_file(key_file, &key) != 0)
        return 1;
    if (!dry_run) {
        fd = connect_to(to);
        if (fd < 0)
            return 1;
    }

    clock_gettime(CLOCK_MONOTONIC, &due);
    for (seq = 0; !have_count || seq < count; seq++) {
        encode(hb, id, (uint32_t)incarnation, seq, key_file ? &key : NULL);
        if (dry_run) {
            for (i = 0; i < HB_LEN; i++)
                printf("%02x", hb[i]);
            printf("\n");
            continue;
        }
        /* Due one interval after the previous one was due, whenever it was sent... */
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &due, NULL) == EINTR)
            ;
        /* A transient error (no route yet, ICMP feedback) must not stop a heartbeat sender. */
        if (send(fd, hb, HB_LEN, 0) != HB_LEN)
            fprintf(stderr, "hb_send: sending heartbeat %llu: %s\n", (unsigned long long)seq,
                    strerror(errno));
        /* ...unless this one went out over half an interval late: a stall, after which the
         * schedule starts again from now (see the comment at the top). Read after the send: a
         * stop between a read before it and the send would go unseen. */
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (ns_between(&due, &now) > interval_ms * UINT64_C(500000))
            due = now;
        add_ns(&due, interval_ms * UINT64_C(1000000));
    }
    if (fd >= 0)
        close(fd);
    return 0;
}
