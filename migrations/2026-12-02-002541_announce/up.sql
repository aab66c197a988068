-- The one place a notification of a changed row is built, called by the statements that change
-- rows (`.sql` files) and by the Rust code alike (`events::announce`): `<what>:<id>` on the
-- events channel (`order:<transition id>`, `comp:<event id>`, `ticket:<ticket id>`,
-- `ticketchange:<ticket id>`), sent when the transaction commits. `events.rs` reads them.
CREATE FUNCTION fitorder_announce(what text, id bigint) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('fitorder_events', what || ':' || id);
END
$$;
