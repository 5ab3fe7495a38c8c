/*
 * A person's pause, for scripts that follow the README at human speed (scripts/try-readme-in-order.sh).
 * LD_PRELOAD it into every process of a walkthrough (isle sim, isle serve, isle, curl, date, python)
 * and each one's clocks run ahead by the number of seconds in the file ISLE_PAUSE_CLOCK_FILE: writing
 * 1800 there is everyone's clock jumping 30 minutes at once, as if the person had left the terminal
 * for half an hour with the laptop asleep. Only wall time moves (CLOCK_REALTIME, gettimeofday,
 * time), as it does across a suspend: the monotonic clocks stand still then, and waits armed on them
 * (NIO's timers, Task.sleep, nanosleep) keep their length, never late by the offset.
 * The file is read again at most every 100 ms of real time. Nothing else is changed (libfaketime
 * also rewrites the environment, which takes Swift programs' arguments away).
 *   gcc -O2 -shared -fPIC -o pause-clock.so pause-clock.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static _Atomic long long offset_ns;
static _Atomic long long next_read_ns;
static __thread int reading;

static long long raw_monotonic_ns(void) {
    struct timespec t;
    syscall(SYS_clock_gettime, CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void refresh(void) {
    if (reading) return;
    long long now = raw_monotonic_ns();
    if (now < atomic_load(&next_read_ns)) return;
    atomic_store(&next_read_ns, now + 100000000LL);
    const char *path = getenv("ISLE_PAUSE_CLOCK_FILE");
    if (!path) return;
    reading = 1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        char buf[32];
        ssize_t n = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (n > 0) {
            buf[n] = 0;
            long long seconds = 0;
            int negative = 0, i = 0;
            while (buf[i] == ' ') i++;
            if (buf[i] == '-') { negative = 1; i++; }
            for (; buf[i] >= '0' && buf[i] <= '9'; i++) seconds = seconds * 10 + (buf[i] - '0');
            atomic_store(&offset_ns, (negative ? -seconds : seconds) * 1000000000LL);
        }
    }
    reading = 0;
}

static int shifted(clockid_t id) {
    return id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    static int (*real)(clockid_t, struct timespec *);
    if (!real) real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    int r = real(id, ts);
    if (r == 0 && shifted(id)) {
        refresh();
        long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + atomic_load(&offset_ns);
        ts->tv_sec = ns / 1000000000LL;
        ts->tv_nsec = ns % 1000000000LL;
    }
    return r;
}

int gettimeofday(struct timeval *tv, void *tz) {
    struct timespec ts;
    int r = clock_gettime(CLOCK_REALTIME, &ts);
    if (r == 0 && tv) { tv->tv_sec = ts.tv_sec; tv->tv_usec = ts.tv_nsec / 1000; }
    (void)tz;
    return r;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out) *out = ts.tv_sec;
    return ts.tv_sec;
}
