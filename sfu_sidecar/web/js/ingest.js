// Caption ingest transport: POST /api/streams/{stream}/captions with the publish token. No DOM.

import { serverReason } from "./publishcore.js";

// Posts a JSON body made by publishcore.cueBody. Resolves {ok, status, reason, text}: `reason`
// is the server's own words on a refusal (or the network error), `text` the reply as sent, so
// the exact epoch_ns in it survives (JSON.parse would round it).
export async function postCaptions(base, stream, bodyText, token) {
  const url = new URL(`/api/streams/${encodeURIComponent(stream)}/captions`, base);
  const headers = { "Content-Type": "application/json" };
  if (token) headers.Authorization = `Bearer ${token}`;
  let resp;
  try {
    resp = await fetch(url, { method: "POST", headers, body: bodyText });
  } catch (err) {
    return { ok: false, status: null, reason: `network error: ${err.message ?? err}`, text: "" };
  }
  const text = await resp.text();
  return { ok: resp.ok, status: resp.status, reason: resp.ok ? null : serverReason(resp.status, text), text };
}
