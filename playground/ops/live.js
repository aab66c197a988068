// The ops pages' live connection: graphql-transport-ws by hand over /graphql/ws. Subscribes every
// one of `subscriptions` after each connection_ack, answers pings, reconnects with backoff and
// jitter, and reports where it stands through `status(state, retryInSeconds)`:
// 'connecting', 'reconnecting', 'live', 'offline', 'notSubscribed'. A 4403 close (the token
// refused) calls `refused()` and does not reconnect; `reconnected()` runs after a connection
// that followed another (what happened meanwhile is to be read again).

export function live({ token, doc, subscriptions, status, refused, reconnected = () => {}, report = () => {} }) {
  const ws = { socket: null, active: new Map(), nextId: 1, attempt: 0, retryTimer: null, ackTimer: null, acked: false, stopped: false };
  const send = (socket, msg) => { if (socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify(msg)); };
  const messages = (m) => [].concat(m).map((x) => x && x.message).join('; ');

  function connect() {
    clearTimeout(ws.retryTimer); ws.retryTimer = null;
    status(ws.acked ? 'reconnecting' : 'connecting');
    const socket = new WebSocket((location.protocol === 'https:' ? 'wss://' : 'ws://') + location.host + '/graphql/ws', 'graphql-transport-ws');
    ws.socket = socket;
    socket.onopen = () => {
      send(socket, { type: 'connection_init', payload: { authorization: 'Bearer ' + token } });
      ws.ackTimer = setTimeout(() => socket.close(4408, 'no connection_ack'), 10000);
    };
    socket.onmessage = (e) => {
      if (ws.socket !== socket) return;
      let msg;
      try { msg = JSON.parse(e.data); } catch { socket.close(4400, 'unreadable message'); return; }
      const sub = ws.active.get(msg.id);
      switch (msg.type) {
        case 'connection_ack': {
          clearTimeout(ws.ackTimer);
          const again = ws.acked;
          ws.acked = true; ws.attempt = 0; ws.active.clear();
          for (const s of subscriptions) {
            const id = String(ws.nextId++);
            ws.active.set(id, s);
            send(socket, { id, type: 'subscribe', payload: { query: doc, operationName: s.op, variables: s.variables || {} } });
          }
          status('live');
          if (again) reconnected();
          break;
        }
        case 'next':
          if (!sub) break;
          if (msg.payload.errors) report(new Error(sub.op + ': ' + messages(msg.payload.errors)));
          if (msg.payload.data) sub.onNext(msg.payload.data);
          break;
        case 'error':
          ws.active.delete(msg.id);
          report(new Error((sub ? sub.op : 'subscription') + ' failed: ' + messages(msg.payload)));
          if (!ws.active.size) status('notSubscribed');
          break;
        case 'complete':
          ws.active.delete(msg.id);
          if (!ws.active.size) status('notSubscribed');
          break;
        case 'ping': send(socket, { type: 'pong', payload: msg.payload }); break;
        default: break; // pong and anything new
      }
    };
    socket.onclose = (e) => {
      clearTimeout(ws.ackTimer);
      if (ws.socket !== socket) return; // closed on purpose
      ws.socket = null; ws.active.clear();
      if (e.code === 4403) { refused(); return; }
      const delay = Math.min(30000, 1000 * 2 ** ws.attempt++) * (0.8 + Math.random() * 0.4);
      status('offline', Math.round(delay / 1000));
      ws.retryTimer = setTimeout(connect, delay);
    };
  }
  const online = () => { if (ws.retryTimer) connect(); };
  window.addEventListener('online', online);
  connect();
  return {
    stop() {
      clearTimeout(ws.retryTimer); clearTimeout(ws.ackTimer);
      window.removeEventListener('online', online);
      const s = ws.socket; ws.socket = null; ws.active.clear();
      if (s) s.close(1000, 'bye');
    },
  };
}
