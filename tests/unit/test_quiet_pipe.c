/* quiet_pipe (verbs.c): a SIGPIPE raised during a guarded call is discarded, the thread's
 * mask and errno come back as they were, and one already pending stays for its owner. */
#include "verbs.h"

#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

/* What siw does inside ibv_post_send: a socket write without MSG_NOSIGNAL to a closed peer. */
static void write_to_closed_peer(void) {
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    close(sv[1]);
    assert_int_equal(write(sv[0], "x", 1), -1);
    close(sv[0]);
}

static bool pipe_pending(void) {
    sigset_t p;
    sigpending(&p);
    return sigismember(&p, SIGPIPE);
}

static bool pipe_blocked(void) {
    sigset_t m;
    pthread_sigmask(SIG_SETMASK, NULL, &m);
    return sigismember(&m, SIGPIPE);
}

/* Runs fn in a child with SIGPIPE's default action: 0 if it exited 0, else its wait status. */
static int in_child(void (*fn)(bool), bool on) {
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGPIPE, SIG_DFL);
        fn(on);
        _exit(0);
    }
    int status;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : status;
}

static void guarded_write(bool on) {
    struct quiet_pipe q;
    quiet_pipe_begin(&q, on);
    write_to_closed_peer();
    errno = EPIPE;
    quiet_pipe_end(&q);
    if (errno != EPIPE || pipe_pending() || pipe_blocked()) _exit(3);
}

static void test_discards_sigpipe(void **state) {
    (void)state;
    assert_int_equal(in_child(guarded_write, true), 0);
}

static void test_off_changes_nothing(void **state) {
    (void)state;
    /* the control: unguarded, the same write kills the process */
    int status = in_child(guarded_write, false);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGPIPE);
}

static void keeps_earlier_pending(bool on) {
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, NULL);
    raise(SIGPIPE); /* someone else's, pending before the call */
    struct quiet_pipe q;
    quiet_pipe_begin(&q, on);
    write_to_closed_peer();
    quiet_pipe_end(&q);
    if (!pipe_pending() || !pipe_blocked()) _exit(4);
}

static void test_keeps_a_pending_sigpipe_and_mask(void **state) {
    (void)state;
    assert_int_equal(in_child(keeps_earlier_pending, true), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_discards_sigpipe),
        cmocka_unit_test(test_off_changes_nothing),
        cmocka_unit_test(test_keeps_a_pending_sigpipe_and_mask),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
