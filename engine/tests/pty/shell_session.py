"""Drives `minisgl shell` in a pseudo-terminal, as a person at a terminal would.

Run by engine/tests/quickstart.rs: python3 shell_session.py MINISGL_BINARY ARGS...
Steps: ask a question and wait for the reply; press Up (history) and check the
question is shown again on the prompt line, then Enter to send it; ask for a long
reply and press Ctrl-C while it streams: the reply stops ("[stopped]") and the
prompt comes back; finally Ctrl-D leaves with status 0. Prints the transcript;
exits non-zero (with the reason) when a step does not happen in time.
"""
import os, pty, select, sys, time

QUESTION = "What is the capital of France?"
LONG = "Write a long story about a dragon who learns to paint."


def main():
    argv = sys.argv[1:]
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(argv[0], argv)
    out = bytearray()

    def read_until(pred, within, what):
        deadline = time.time() + within
        while time.time() < deadline:
            r, _, _ = select.select([fd], [], [], 0.1)
            if r:
                try:
                    chunk = os.read(fd, 4096)
                except OSError:
                    break
                if not chunk:
                    break
                out.extend(chunk)
            if pred(out.decode("utf-8", "replace")):
                return
        fail(f"timed out waiting for {what}")

    def fail(why):
        sys.stdout.write(out.decode("utf-8", "replace"))
        sys.stdout.write(f"\nFAILED: {why}\n")
        sys.stdout.flush()
        try:
            os.kill(pid, 9)
        except OSError:
            pass
        sys.exit(1)

    def text():
        return out.decode("utf-8", "replace")

    def after(pos, needle, within, what):
        """Waits for `needle` in the output past byte `pos`; returns its end."""
        read_until(lambda t: needle in out[pos:].decode("utf-8", "replace"), within, what)
        return pos + out[pos:].index(needle.encode()) + len(needle.encode())

    after(0, ">>> ", 120, "the first prompt")
    time.sleep(0.5)
    pos = len(out)
    os.write(fd, (QUESTION + "\r").encode())
    end = after(pos, ">>> ", 60, "the reply to the question")
    if "Paris" not in out[pos:end].decode("utf-8", "replace"):
        fail("the reply does not name Paris")
    # History: Up brings the question back onto the prompt line (rustyline
    # redraws the line, prompt included), and Enter sends it again.
    pos = len(out)
    os.write(fd, b"\x1b[A")
    after(pos, QUESTION, 10, "the question recalled by the Up arrow")
    pos = len(out)
    os.write(fd, b"\r")
    after(pos, ">>> ", 60, "the reply to the recalled question")
    # Ctrl-C while a long reply streams stops it, and the shell stays.
    pos = len(out)
    os.write(fd, (LONG + "\r").encode())
    read_until(lambda t: len(out) > pos + len(LONG) + 40, 60, "the long reply to start")
    os.write(fd, b"\x03")
    stopped = after(pos, "[stopped]", 30, "the reply to stop")
    after(stopped, ">>> ", 30, "the prompt after the stopped reply")
    # Ctrl-D leaves.
    os.write(fd, b"\x04")
    deadline = time.time() + 30
    status = None
    while time.time() < deadline:
        try:
            r, _, _ = select.select([fd], [], [], 0.1)
            if r:
                out.extend(os.read(fd, 4096))
        except OSError:
            pass
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
    else:
        fail("the shell did not leave on Ctrl-D")
    sys.stdout.write(out.decode("utf-8", "replace"))
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        print(f"\nFAILED: the shell exited with {code}")
        sys.exit(1)
    print("\nOK")


main()
