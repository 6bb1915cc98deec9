// The watchdog: a launch stops at its time limit even in a loop that never touches memory nor
// meets another thread, where the runtime's own checks (memory.cpp's, the scheduler's) never run:
// `while (flag == 0) {}` on a non-volatile flag compiles to a jump to itself. A SIGINT (a notebook's
// interrupt, Ctrl-C) stops the launch at once, and is then passed on to the handler before it.
//
// While a launch runs, a POSIX timer sends this thread a signal every quarter second. Past the
// deadline, when the signal has interrupted a fiber in the kernel's own code (between the markers
// build.py links around the kernel's object; never in the runtime, which might be half-way through
// updating its state), the handler makes that fiber resume in stuck_in_kernel() instead, as if
// the loop had called it: the finding names the loop's line, and the fiber leaves for the
// scheduler as any stopped launch does. Linux on x86-64 only: elsewhere only the runtime's own
// checks stop a launch.
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include "runtime.h"

extern "C" void attn_cpu_kernel_text_begin();
extern "C" void attn_cpu_kernel_text_end();

namespace attn_cpu {
bool in_kernel_code(uintptr_t ip) {
    return ip >= (uintptr_t)&attn_cpu_kernel_text_begin && ip < (uintptr_t)&attn_cpu_kernel_text_end;
}
}  // namespace attn_cpu

namespace attn_cpu {

#if defined(__x86_64__) && defined(__linux__)
#ifndef sigev_notify_thread_id
#define sigev_notify_thread_id _sigev_un._tid
#endif

static timer_t timer;
static bool armed = false, tick_installed = false;
static struct sigaction before_interrupt;

__attribute__((noinline)) static void stuck_in_kernel() {
    report("timeout", g.cur, __builtin_return_address(0),
           g.interrupted ? timeout_text()
                         : std::string("the launch ran past its time limit in a loop that neither touches memory nor "
                                       "meets another thread (an endless loop?)"));
    abort_launch();
}

static long long accesses_at_last_tick = -1;

static void on_tick(int, siginfo_t*, void* context) {
    if (!g.cur || g.aborted || g.deadline <= 0 || now_seconds() <= g.deadline) return;
    // A launch still touching memory stops at memory.cpp's next check, which says where in the
    // grid it was: only one that has touched none for a whole tick is stuck in such a loop.
    if (g.accesses != accesses_at_last_tick && !g.interrupted) {
        accesses_at_last_tick = g.accesses;
        return;
    }
    greg_t* r = static_cast<ucontext_t*>(context)->uc_mcontext.gregs;
    const uintptr_t sp = (uintptr_t)r[REG_RSP], ip = (uintptr_t)r[REG_RIP];
    const uintptr_t lo = (uintptr_t)g.stacks, hi = lo + STACK_BYTES * MAX_THREADS;
    if (sp < lo || sp >= hi) return;  // the scheduler's stack: it checks the deadline itself
    if (!in_kernel_code(ip)) return;
    // A return address into the loop, in the interrupted code's red zone (it is never resumed), so
    // that nothing of the signal frame below is touched before sigreturn reads it; aligned as
    // after a call.
    const uintptr_t top = ((sp - 64) & ~(uintptr_t)15) - 8;
    *reinterpret_cast<uintptr_t*>(top) = ip + 1;  // findings take a return address minus one
    r[REG_RSP] = (greg_t)top;
    r[REG_RIP] = (greg_t)&stuck_in_kernel;
}

static void on_interrupt(int sig, siginfo_t* info, void* context) {
    g.interrupted = 1;
    g.deadline = 1e-9;  // already past: the next check anywhere stops the launch
    if (before_interrupt.sa_flags & SA_SIGINFO) {
        if (before_interrupt.sa_sigaction) before_interrupt.sa_sigaction(sig, info, context);
    } else if (before_interrupt.sa_handler != SIG_DFL && before_interrupt.sa_handler != SIG_IGN) {
        before_interrupt.sa_handler(sig);
    }
}

void watchdog_arm() {
    g.interrupted = 0;
    accesses_at_last_tick = -1;
    struct sigaction tick = {}, interrupt = {};
    tick.sa_sigaction = on_tick;
    tick.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&tick.sa_mask);
    interrupt.sa_sigaction = on_interrupt;
    interrupt.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&interrupt.sa_mask);
    // The tick's handler stays once installed: a tick still queued after the timer is gone then
    // finds no launch and does nothing, where the default action would end the process.
    if (!tick_installed && sigaction(SIGRTMIN + 4, &tick, nullptr) != 0) return;
    tick_installed = true;
    sigaction(SIGINT, &interrupt, &before_interrupt);
    sigevent event = {};
    event.sigev_notify = SIGEV_THREAD_ID;
    event.sigev_signo = SIGRTMIN + 4;
    event.sigev_notify_thread_id = (pid_t)syscall(SYS_gettid);
    if (timer_create(CLOCK_MONOTONIC, &event, &timer) != 0) {
        sigaction(SIGINT, &before_interrupt, nullptr);
        return;
    }
    itimerspec every = {};
    every.it_value.tv_nsec = every.it_interval.tv_nsec = 250000000;
    timer_settime(timer, 0, &every, nullptr);
    armed = true;
}

void watchdog_disarm() {
    if (!armed) return;
    timer_delete(timer);
    sigaction(SIGINT, &before_interrupt, nullptr);
    armed = false;
    // An interrupt the process had no handler of its own for ends it, as it would have at once.
    if (g.interrupted && before_interrupt.sa_handler == SIG_DFL && !(before_interrupt.sa_flags & SA_SIGINFO))
        raise(SIGINT);
}
#else
void watchdog_arm() {}
void watchdog_disarm() {}
#endif

}  // namespace attn_cpu
