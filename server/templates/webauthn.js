function fromB64url(text) {
  const b64 = text.replace(/-/g, "+").replace(/_/g, "/");
  const raw = atob(b64 + "===".slice((b64.length + 3) % 4));
  return Uint8Array.from(raw, (c) => c.charCodeAt(0)).buffer;
}
function toB64url(buffer) {
  let raw = "";
  for (const byte of new Uint8Array(buffer)) raw += String.fromCharCode(byte);
  return btoa(raw).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}
function creationOptions(o) {
  const publicKey = {...o, challenge: fromB64url(o.challenge),
    user: {...o.user, id: fromB64url(o.user.id)},
    excludeCredentials: (o.excludeCredentials || []).map((c) => ({...c, id: fromB64url(c.id)}))};
  return {publicKey};
}
function requestOptions(o) {
  const publicKey = {...o, challenge: fromB64url(o.challenge),
    allowCredentials: (o.allowCredentials || []).map((c) => ({...c, id: fromB64url(c.id)}))};
  return {publicKey};
}
function credentialJSON(c) {
  const r = c.response;
  const response = {clientDataJSON: toB64url(r.clientDataJSON)};
  if (r.attestationObject) {
    response.attestationObject = toB64url(r.attestationObject);
    response.transports = r.getTransports ? r.getTransports() : [];
  } else {
    response.authenticatorData = toB64url(r.authenticatorData);
    response.signature = toB64url(r.signature);
    if (r.userHandle) response.userHandle = toB64url(r.userHandle);
  }
  return {id: c.id, rawId: toB64url(c.rawId), type: c.type, response,
          authenticatorAttachment: c.authenticatorAttachment || undefined,
          clientExtensionResults: c.getClientExtensionResults()};
}
