DROP FUNCTION fitorder_announce(text, bigint);
