-- On the primary: where a viewer's last write had reached (no row: the viewer never wrote).
SELECT lsn::text AS lsn FROM read_your_writes WHERE viewer = $1
