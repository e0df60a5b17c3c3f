"""Drives the chat page (GET /) in headless Chromium through chromedriver's
WebDriver protocol (plain HTTP and JSON, standard library only).

Run by engine/tests/chat_page.rs:
    python3 chat_page.py SERVER_URL CHROMIUM CHROMEDRIVER SCREENSHOT_PNG
Loads the page, sets max_tokens, types a message and sends it, then watches the
assistant's bubble: the reply must appear in pieces (streamed), end, and the
stats line must show tokens per second. Prints what it saw; exits non-zero with
the reason when a step fails.
"""
import base64, json, os, socket, subprocess, sys, time, urllib.request

ELEMENT = "element-6066-11e4-a52e-4f735466cecf"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    server, chromium, chromedriver, screenshot = sys.argv[1:5]
    port = free_port()
    driver = subprocess.Popen([chromedriver, f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"

    def call(method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(base + path, data=data, method=method, headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read() or b"{}").get("value")

    try:
        deadline = time.time() + 30
        while True:
            try:
                call("GET", "/status")
                break
            except OSError:
                if time.time() > deadline:
                    sys.exit("chromedriver did not start")
                time.sleep(0.1)
        args = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1000,700"]
        caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome",
                "goog:chromeOptions": {"binary": chromium, "args": args}}}}
        session = call("POST", "/session", caps)["sessionId"]
        s = f"/session/{session}"

        def find(css):
            return call("POST", s + "/element", {"using": "css selector", "value": css})[ELEMENT]

        def script(js):
            return call("POST", s + "/execute/sync", {"script": js, "args": []})

        call("POST", s + "/url", {"url": server + "/"})
        title = call("GET", s + "/title")
        if "minisgl" not in title:
            sys.exit(f"the page's title is {title!r}")
        # The page asks /v1/models for the model's name.
        deadline = time.time() + 10
        while "model: …" in script("return document.getElementById('model').textContent") and time.time() < deadline:
            time.sleep(0.1)
        print("model line:", script("return document.getElementById('model').textContent"))
        script("document.getElementById('max_tokens').value = '40'")
        call("POST", s + f"/element/{find('#input')}/value", {"text": "Tell me about Paris, the capital of France."})
        call("POST", s + f"/element/{find('#send')}/click", {})
        seen = []
        deadline = time.time() + 60
        state = None
        while time.time() < deadline:
            state = script("""
                const a = document.querySelector('.msg.assistant, .msg.error');
                return a ? [a.className, a.textContent, a.dataset.done,
                            document.getElementById('stats').textContent] : null;""")
            if state and state[1] and (not seen or seen[-1] != state[1]):
                seen.append(state[1])
            if state and state[2] == "true":
                break
            time.sleep(0.05)
        png = call("GET", s + "/screenshot")
        with open(screenshot, "wb") as f:
            f.write(base64.b64decode(png))
        call("DELETE", s)
        print("states seen:", len(seen))
        print("final:", json.dumps(state))
        if not state or state[2] != "true":
            sys.exit("the reply did not finish in time")
        if "error" in state[0]:
            sys.exit(f"the page shows an error: {state[1]}")
        if not state[1].strip():
            sys.exit("the reply is empty")
        if len(seen) < 2:
            sys.exit("the reply did not stream (it appeared at once)")
        if "tok/s" not in state[3]:
            sys.exit(f"no tokens/s in the stats line: {state[3]!r}")
        print("OK")
    finally:
        driver.terminate()
        driver.wait(10)


main()
