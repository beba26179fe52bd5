// The dashboard's one push channel: a WebSocket to the probe, reopened with backoff. Transport
// only: messages go to the callback as parsed JSON, nothing here touches the page.

const FIRST_RETRY_MS = 500;
const LAST_RETRY_MS = 10000;

export function connectDashboard(url, { onMessage, onState = () => {} }) {
  let ws = null;
  let retryMs = FIRST_RETRY_MS;
  let stopped = false;

  function open() {
    ws = new WebSocket(url);
    ws.addEventListener("open", () => {
      retryMs = FIRST_RETRY_MS;
      onState("open");
    });
    ws.addEventListener("message", (event) => {
      let message;
      try {
        message = JSON.parse(event.data);
      } catch {
        return; // the probe sends JSON only; anything else is not for us
      }
      onMessage(message);
    });
    ws.addEventListener("close", () => {
      onState("closed");
      if (stopped) return;
      setTimeout(open, retryMs);
      retryMs = Math.min(retryMs * 2, LAST_RETRY_MS);
    });
  }

  open();
  return {
    close() {
      stopped = true;
      ws?.close();
    },
  };
}
