async function postJSON(url, body, csrf) {
  const headers = {"Content-Type": "application/json"};
  if (csrf) headers["X-CSRF-Token"] = csrf;
  const r = await fetch(url, {
    method: "POST", headers, body: JSON.stringify(body), credentials: "same-origin",
  });
  let answer = {};
  try { answer = await r.json(); } catch (e) { answer = {}; }
  return [r, answer];
}
function said(answer) {
  const e = answer.error || {};
  return (e.message || "The server refused.") + (e.hint ? " " + e.hint : "");
}
const signOut = document.getElementById("signout");
if (signOut) {
  signOut.addEventListener("click", async () => {
    await postJSON("/signout", {}, signOut.dataset.csrf);
    location.assign("/signin");
  });
}
