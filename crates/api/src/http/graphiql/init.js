// fitorder's GraphiQL: queries and mutations over POST /graphql, subscriptions over
// /graphql/ws (graphql-transport-ws) with the header editor's Authorization sent in
// connection_init. Served from this service with the pinned assets; nothing else is loaded.
(function () {
  'use strict';
  var wsUrl = (location.protocol === 'https:' ? 'wss://' : 'ws://') + location.host + '/graphql/ws';
  var clients = {};

  function header(headers, name) {
    for (var k in headers) if (k.toLowerCase() === name) return headers[k];
    return undefined;
  }

  // The kind of the operation that will run: the named one, or the only one.
  function kindOf(query, operationName) {
    var re = /(^|[}\s])(query|mutation|subscription)\b\s*([_A-Za-z][_0-9A-Za-z]*)?/g;
    var m, first = null;
    while ((m = re.exec(query))) {
      if (!first) first = m[2];
      if (operationName && m[3] === operationName) return m[2];
    }
    return first || 'query';
  }

  function wsClient(authorization) {
    var key = authorization || '';
    if (!clients[key]) {
      clients[key] = graphqlWs.createClient({
        url: wsUrl,
        lazy: true,
        connectionParams: authorization ? { authorization: authorization } : {},
      });
    }
    return clients[key];
  }

  function fetcher(params, opts) {
    var headers = (opts && opts.headers) || {};
    if (kindOf(params.query || '', params.operationName) === 'subscription') {
      return wsClient(header(headers, 'authorization')).iterate(params);
    }
    var h = { 'content-type': 'application/json', accept: 'application/graphql-response+json, application/json;q=0.9' };
    for (var k in headers) h[k] = headers[k];
    return fetch('/graphql', { method: 'POST', headers: h, body: JSON.stringify(params) }).then(function (r) {
      return r.json();
    });
  }

  // The contract's documents (playground/operations/), one tab per operation, with their
  // example variables: what the member app, the admin console and the ops screen send.
  var defaultHeaders = JSON.stringify({ Authorization: 'Bearer <paste a token from `fitorder token`>' }, null, 2);
  var tabs = (window.fitorderTabs || []).map(function (t) {
    return { query: t.query, variables: t.variables, headers: defaultHeaders };
  });

  ReactDOM.createRoot(document.getElementById('graphiql')).render(
    React.createElement(GraphiQL, {
      fetcher: fetcher,
      defaultTabs: tabs.length ? tabs : undefined,
      defaultHeaders: defaultHeaders,
      defaultEditorToolsVisibility: 'headers',
      shouldPersistHeaders: true,
    })
  );
})();
