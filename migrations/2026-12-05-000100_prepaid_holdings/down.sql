DROP FUNCTION prepaid_holdings(bigint, text, date, text);
