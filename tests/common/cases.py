"""Pass/fail bookkeeping shared by kite's Python test scripts (tests/cli, tests/python): `@case` runs the
function at once and records it; `finish()` prints the tally and exits non-zero when a case failed. An
unexpected exception fails its case and the script goes on to the next one. Each line gives the case's wall
seconds, so a log shows where a script's time goes."""
import sys, time

passed = failed = 0


def case(fn):
    global passed, failed
    start = time.monotonic()
    try:
        fn()
        passed += 1
        print("PASS", fn.__name__, "(%.2f s)" % (time.monotonic() - start), flush=True)
    except AssertionError as e:
        failed += 1
        print("FAIL", fn.__name__, "(%.2f s)" % (time.monotonic() - start), e, flush=True)
    except Exception as e:
        failed += 1
        print("FAIL", fn.__name__, "(%.2f s)" % (time.monotonic() - start), type(e).__name__, e, flush=True)
    return fn


def finish():
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
