-- One line per recent alert (the newest $1) and its deliveries, for `fitorder alerts`.
SELECT a.id || '  ' || to_char(a.created_at, 'YYYY-MM-DD HH24:MI:SS') || '  ' || a.cause || '  '
       || COALESCE(a.order_no, '-') || '  trace ' || a.trace_id || '  '
       || COALESCE((SELECT string_agg(d.channel || ' ' || d.status || ' x' || d.attempts
                                      || COALESCE(' (' || left(d.last_error, 80) || ')', ''), ', ' ORDER BY d.id)
                      FROM alert_deliveries d WHERE d.alert_id = a.id),
                   CASE WHEN a.fanned_out_at IS NULL THEN 'not sent yet' ELSE 'no channel' END) AS line
  FROM alerts a ORDER BY a.id DESC LIMIT $1
