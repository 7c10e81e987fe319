"""The browser approval page at /approve/{token} over real HTTP, on SQLite and PostgreSQL: what
it shows of the call waiting for approval (tool, arguments, code, who asked, until when),
long code as an excerpt, markup escaped, the headers that keep it private, and the page for
a link that is not valid. The API behind it is in test_approval_api.

The app is the real one (`create_app`), served by uvicorn on a loopback port in a background
thread with its lifespan (boot recovery, drain, close; see tests.support.approval_app);
requests are real HTTP through httpx2. Approval URLs are obtained the way clients get them:
once through the MCP `execute` tool, otherwise minted for a paused execution exactly as
`ApprovalSurface.approval_url` does.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from tests.support.approval_app import (
    PRINCIPAL,
    WRITE_NOTE,
    Served,
    assert_clear_page,
    mcp_execute,
    texts,
    token_of,
)
from tests.support.canary import CANARY

pytest_plugins = ["tests.support.approval_app"]


# -- the page -------------------------------------------------------------------------------


def test_mcp_approval_url_opens_a_page_showing_what_will_run(served: Served) -> None:
    answer = mcp_execute(served)
    assert answer["status"] == "waiting_for_interaction"
    interaction = answer["interaction"]
    url = interaction["approvalUrl"]
    assert url.startswith(f"{served.url}/approve/")
    assert len(token_of(url)) >= 40  # 256 random bits, url-safe

    response = served.get(url.removeprefix(served.url))
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    found = texts(response.text)
    assert found.by_id["tool"] == "tools.notes.write"
    assert json.loads(found.by_id["args"]) == {"key": "greeting", "text": "hello there"}
    assert 'tools.notes.write(key="greeting", text="hello there")' in found.by_id["code"]
    assert found.by_id["who"] == PRINCIPAL
    expires = datetime.fromisoformat(answer["expiresAt"])
    assert expires.astimezone(UTC).strftime("%Y-%m-%d %H:%M") in found.by_id["expires"]
    assert f'datetime="{answer["expiresAt"]}"' in response.text
    assert [b.strip() for b in found.buttons] == ["Approve", "Decline"]
    # Not cacheable, not frameable, no Referer carrying the token, scripts by nonce only.
    headers = response.headers
    assert headers["cache-control"] == "no-store"
    assert headers["x-frame-options"] == "DENY"
    assert headers["referrer-policy"] == "no-referrer"
    csp = headers["content-security-policy"]
    assert "frame-ancestors 'none'" in csp and "script-src 'nonce-" in csp
    assert CANARY not in response.text
    # Opening the page does not use the link up (link previews must not burn it).
    assert served.get(url.removeprefix(served.url)).status_code == 200
    assert served.status_of(answer["executionId"]) == "waiting_for_interaction"


def test_long_code_is_shown_as_an_excerpt(served: Served) -> None:
    filler = "\n".join(f"x{i} = {i}" for i in range(600))
    view = served.pause(filler + "\n" + WRITE_NOTE)
    page = served.get(f"/approve/{served.mint(view)}")
    code = texts(page.text).by_id["code"]
    assert code.startswith("x0 = 0\n") and "more characters)" in code
    assert len(code) < 2200


def test_markup_in_code_and_arguments_is_escaped(served: Served) -> None:
    evil = "</script><script>alert(1)</script><img src=x onerror=alert(2)>"
    code = f"text = {evil!r}\n# {evil}\ntools.notes.write(key={evil!r}, text=text)"
    view = served.pause(code)
    token = served.mint(view)
    page = served.get(f"/approve/{token}").text
    assert "<script>alert" not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    found = texts(page)
    assert json.loads(found.by_id["args"]) == {"key": evil, "text": evil}
    assert evil in found.by_id["code"]
    # Exactly two script elements: the JSON data block and the page's own (nonced) code.
    assert page.count("<script") == 2
    data = page.split('<script type="application/json" id="data">', 1)[1].split("</script>")[0]
    assert json.loads(data) == {"token": token, "executionId": view.id}


def test_unknown_token_page(served: Served) -> None:
    for token in ("not-a-real-token", "A" * 43, "%3Cscript%3E"):
        page = assert_clear_page(served.get(f"/approve/{token}"), 404, "not valid")
        assert "<script" not in page
    assert served.get("/approve/").status_code == 404
