// The WebSocket URL of a path of the service: wss: when the page (or `base`) came over HTTPS,
// ws: otherwise (a browser refuses ws: from an https: page).

export function wsUrl(path, base = globalThis.location?.href) {
  const url = new URL(path, base);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  return url.href;
}
