// The tables of migrations/, for diesel's query builder. Kept by hand (no diesel CLI on CI);
// `tests/it/schema_drift.rs` compares it with the migrated database.

diesel::table! {
    stores (id) {
        id -> Int8,
        name -> Text,
        code -> Text,
        created_at -> Timestamptz,
        operator_code -> Text,
    }
}

diesel::table! {
    members (id) {
        id -> Int8,
        store_id -> Int8,
        name -> Text,
        phone -> Text,
        balance_cents -> Int8,
        frozen_cents -> Int8,
        created_at -> Timestamptz,
        wechat_open_id -> Nullable<Text>,
    }
}

diesel::table! {
    membership_plans (id) {
        id -> Int8,
        store_id -> Int8,
        name -> Text,
        duration_days -> Int4,
        price_cents -> Int8,
        created_at -> Timestamptz,
        max_freeze_days -> Int4,
        max_freezes -> Int4,
        retired_at -> Nullable<Timestamptz>,
    }
}

diesel::table! {
    class_packs (id) {
        id -> Int8,
        store_id -> Int8,
        name -> Text,
        sessions -> Int4,
        price_cents -> Int8,
        stock -> Nullable<Int4>,
        created_at -> Timestamptz,
        retired_at -> Nullable<Timestamptz>,
    }
}

diesel::table! {
    coach_slots (id) {
        id -> Int8,
        store_id -> Int8,
        coach_name -> Text,
        starts_at -> Timestamptz,
        ends_at -> Timestamptz,
        capacity -> Int4,
        remaining -> Int4,
        price_cents -> Int8,
        created_at -> Timestamptz,
        canceled_at -> Nullable<Timestamptz>,
        cancel_reason -> Nullable<Text>,
        canceled_by -> Nullable<Text>,
        cancel_trace_id -> Nullable<Text>,
        cancel_settled_at -> Nullable<Timestamptz>,
    }
}

diesel::table! {
    orders (id) {
        id -> Int8,
        order_no -> Text,
        member_id -> Int8,
        store_id -> Int8,
        kind -> Text,
        status -> Text,
        item_name -> Text,
        membership_plan_id -> Nullable<Int8>,
        class_pack_id -> Nullable<Int8>,
        coach_slot_id -> Nullable<Int8>,
        plan_days -> Nullable<Int4>,
        amount_cents -> Int8,
        wallet_amount_cents -> Int8,
        payment_method -> Text,
        online_provider -> Nullable<Text>,
        sessions_total -> Int4,
        sessions_used -> Int4,
        expires_at -> Nullable<Timestamptz>,
        created_at -> Timestamptz,
        paid_at -> Nullable<Timestamptz>,
        canceled_at -> Nullable<Timestamptz>,
        cancel_reason -> Nullable<Text>,
        refunded_at -> Nullable<Timestamptz>,
        refund_amount_cents -> Nullable<Int8>,
        provider_txn_id -> Nullable<Text>,
        trace_id -> Text,
        idempotency_key -> Text,
        request_hash -> Text,
        updated_at -> Timestamptz,
    }
}

diesel::table! {
    order_transitions (id) {
        id -> Int8,
        order_id -> Int8,
        from_status -> Nullable<Text>,
        to_status -> Text,
        actor -> Text,
        reason -> Text,
        trace_id -> Text,
        at -> Timestamptz,
    }
}

diesel::table! {
    wallet_ledger (id) {
        id -> Int8,
        member_id -> Int8,
        kind -> Text,
        balance_delta -> Int8,
        frozen_delta -> Int8,
        order_id -> Nullable<Int8>,
        reference -> Nullable<Text>,
        actor -> Text,
        trace_id -> Text,
        created_at -> Timestamptz,
    }
}

diesel::table! {
    payments (id) {
        id -> Int8,
        order_id -> Int8,
        method -> Text,
        idempotency_key -> Text,
        provider_txn_id -> Nullable<Text>,
        amount_cents -> Int8,
        wallet_cents -> Int8,
        online_cents -> Int8,
        reference -> Nullable<Text>,
        actor -> Text,
        trace_id -> Text,
        paid_at -> Timestamptz,
    }
}

diesel::table! {
    refunds (id) {
        id -> Int8,
        order_id -> Int8,
        amount_cents -> Int8,
        wallet_cents -> Int8,
        online_cents -> Int8,
        reason -> Text,
        actor -> Text,
        trace_id -> Text,
        created_at -> Timestamptz,
    }
}

diesel::table! {
    memberships (id) {
        id -> Int8,
        member_id -> Int8,
        store_id -> Int8,
        plan_id -> Int8,
        order_id -> Int8,
        status -> Text,
        valid_from -> Timestamptz,
        valid_to -> Timestamptz,
        created_at -> Timestamptz,
        ended_at -> Nullable<Timestamptz>,
        frozen_days -> Int4,
        transferred_at -> Nullable<Timestamptz>,
    }
}

diesel::table! {
    check_ins (id) {
        id -> Int8,
        order_id -> Int8,
        consume_txn_no -> Text,
        sessions -> Int4,
        remaining_after -> Int4,
        actor -> Text,
        trace_id -> Text,
        at -> Timestamptz,
    }
}

diesel::table! {
    compensation_events (id) {
        id -> Int8,
        order_id -> Nullable<Int8>,
        kind -> Text,
        status -> Text,
        attempts -> Int4,
        max_attempts -> Int4,
        next_attempt_at -> Nullable<Timestamptz>,
        last_error -> Nullable<Text>,
        payload -> Jsonb,
        idempotency_key -> Text,
        trace_id -> Text,
        locked_until -> Nullable<Timestamptz>,
        locked_by -> Nullable<Text>,
        created_at -> Timestamptz,
        updated_at -> Timestamptz,
    }
}

diesel::table! {
    compensation_attempts (id) {
        id -> Int8,
        event_id -> Int8,
        at -> Timestamptz,
        ok -> Bool,
        error -> Nullable<Text>,
        duration_ms -> Int4,
        worker -> Text,
    }
}

diesel::table! {
    anomaly_events (id) {
        id -> Int8,
        category -> Text,
        order_id -> Nullable<Int8>,
        store_id -> Nullable<Int8>,
        detail -> Text,
        trace_id -> Text,
        at -> Timestamptz,
    }
}

diesel::table! {
    payment_callbacks (id) {
        id -> Int8,
        provider -> Text,
        received_at -> Timestamptz,
        verified -> Bool,
        outcome -> Text,
        event_type -> Nullable<Text>,
        body -> Text,
        headers -> Jsonb,
        order_id -> Nullable<Int8>,
        order_no -> Nullable<Text>,
        store_id -> Nullable<Int8>,
        idempotency_key -> Nullable<Text>,
        provider_txn_id -> Nullable<Text>,
        amount_cents -> Nullable<Int8>,
        error -> Nullable<Text>,
        trace_id -> Text,
    }
}

diesel::table! {
    exception_tickets (id) {
        id -> Int8,
        kind -> Text,
        status -> Text,
        provider -> Nullable<Text>,
        order_id -> Nullable<Int8>,
        order_no -> Nullable<Text>,
        store_id -> Nullable<Int8>,
        provider_txn_id -> Nullable<Text>,
        local_amount_cents -> Nullable<Int8>,
        provider_amount_cents -> Nullable<Int8>,
        detail -> Jsonb,
        finding_key -> Text,
        opened_at -> Timestamptz,
        updated_at -> Timestamptz,
        resolved_at -> Nullable<Timestamptz>,
        resolution -> Nullable<Text>,
        resolved_by -> Nullable<Text>,
        note -> Nullable<Text>,
        trace_id -> Text,
    }
}

diesel::table! {
    reconciliation_runs (id) {
        id -> Int8,
        provider -> Text,
        bill_date -> Date,
        status -> Text,
        started_at -> Timestamptz,
        finished_at -> Nullable<Timestamptz>,
        provider_rows -> Int4,
        local_rows -> Int4,
        matched -> Int4,
        tickets_opened -> Int4,
        error -> Nullable<Text>,
        trace_id -> Text,
    }
}

diesel::table! {
    payment_keys (key) {
        key -> Text,
        callback_id -> Int8,
        created_at -> Timestamptz,
    }
}

diesel::table! {
    compensation_replays (id) {
        id -> Int8,
        event_id -> Int8,
        actor -> Text,
        trace_id -> Text,
        at -> Timestamptz,
    }
}

diesel::table! {
    task_runs (id) {
        id -> Int8,
        task -> Text,
        tick -> Timestamptz,
        status -> Text,
        instance -> Text,
        started_at -> Timestamptz,
        finished_at -> Nullable<Timestamptz>,
        rows_touched -> Int8,
        detail -> Nullable<Text>,
    }
}

diesel::table! {
    bill_rows (run_id, line) {
        run_id -> Int8,
        line -> Int4,
        kind -> Text,
        out_trade_no -> Text,
        provider_txn_id -> Text,
        amount_cents -> Int8,
        refund_no -> Nullable<Text>,
        provider_refund_id -> Nullable<Text>,
    }
}

diesel::table! {
    payment_trades (id) {
        id -> Int8,
        order_id -> Int8,
        provider -> Text,
        channel -> Text,
        out_trade_no -> Text,
        amount_cents -> Int8,
        expires_at -> Timestamptz,
        instruction -> Jsonb,
        trace_id -> Text,
        created_at -> Timestamptz,
    }
}

diesel::table! {
    wechat_platform_certs (serial_no) {
        serial_no -> Text,
        pem -> Text,
        effective_at -> Nullable<Timestamptz>,
        expire_at -> Nullable<Timestamptz>,
        fetched_at -> Timestamptz,
    }
}

diesel::table! {
    wechat_platform_cert_refreshes (scope) {
        scope -> Text,
        last_attempt_at -> Nullable<Timestamptz>,
        last_success_at -> Nullable<Timestamptz>,
    }
}

diesel::table! {
    alerts (id) {
        id -> Int8,
        cause -> Text,
        dedupe_key -> Text,
        title -> Text,
        lines -> Jsonb,
        order_no -> Nullable<Text>,
        trace_id -> Text,
        detail -> Jsonb,
        fanned_out_at -> Nullable<Timestamptz>,
        created_at -> Timestamptz,
    }
}

diesel::joinable!(compensation_replays -> compensation_events (event_id));
diesel::joinable!(compensation_attempts -> compensation_events (event_id));
diesel::joinable!(compensation_events -> orders (order_id));
diesel::joinable!(order_transitions -> orders (order_id));

diesel::table! {
    expiry_claims (order_id) {
        order_id -> Int8,
        claimed_until -> Timestamptz,
        claimed_by -> Text,
    }
}

diesel::table! {
    stray_payment_refunds (provider, provider_txn_id) {
        provider -> Text,
        provider_txn_id -> Text,
        ticket_id -> Int8,
        created_at -> Timestamptz,
    }
}

diesel::allow_tables_to_appear_in_same_query!(
    stores,
    members,
    membership_plans,
    class_packs,
    coach_slots,
    orders,
    order_transitions,
    wallet_ledger,
    payments,
    refunds,
    memberships,
    check_ins,
    compensation_events,
    compensation_attempts,
    anomaly_events,
    payment_callbacks,
    exception_tickets,
    reconciliation_runs,
    payment_keys,
    compensation_replays,
    task_runs,
    bill_rows,
    payment_trades,
    expiry_claims,
    wechat_platform_certs,
    wechat_platform_cert_refreshes,
    alerts,
    prepaid_rules,
    business_days,
    order_prepaid,
    prepaid_ledger_days,
    membership_freezes,
    membership_events,
);

diesel::joinable!(membership_freezes -> memberships (membership_id));
diesel::joinable!(membership_events -> memberships (membership_id));

diesel::joinable!(order_prepaid -> orders (order_id));

diesel::joinable!(prepaid_rules -> stores (store_id));

diesel::table! {
    prepaid_rules (store_id) {
        store_id -> Int8,
        preset -> Text,
        membership_max_cents -> Nullable<Int8>,
        membership_max_days -> Nullable<Int4>,
        sessions_max_cents -> Nullable<Int8>,
        sessions_max_count -> Nullable<Int4>,
        top_up_max_cents -> Nullable<Int8>,
        total_max_cents -> Nullable<Int8>,
        cooling_off_days -> Int4,
        refund_within_working_days -> Int4,
        terms_version -> Nullable<Text>,
        terms_text -> Nullable<Text>,
        set_by -> Text,
        trace_id -> Text,
        set_at -> Timestamptz,
    }
}

diesel::table! {
    order_prepaid (order_id) {
        order_id -> Int8,
        accepted_terms_version -> Nullable<Text>,
        cooling_off_days -> Int4,
        refund_within_working_days -> Int4,
        refund_due_by -> Nullable<Date>,
    }
}

diesel::table! {
    prepaid_ledger_days (store_id, day) {
        store_id -> Int8,
        day -> Date,
        collected_cents -> Int8,
        refunded_cents -> Int8,
        balance_cents -> Int8,
        card_rate_cents -> Int8,
        closed_at -> Timestamptz,
    }
}

diesel::table! {
    business_days (day) {
        day -> Date,
        working -> Bool,
        note -> Nullable<Text>,
        set_by -> Text,
        trace_id -> Text,
        set_at -> Timestamptz,
    }
}

diesel::table! {
    membership_freezes (id) {
        id -> Int8,
        membership_id -> Int8,
        state -> Text,
        from_date -> Date,
        until_date -> Date,
        starts_at -> Timestamptz,
        ends_at -> Timestamptz,
        ended_at -> Nullable<Timestamptz>,
        reason -> Text,
        actor -> Text,
        trace_id -> Text,
        created_at -> Timestamptz,
    }
}

diesel::table! {
    membership_events (id) {
        id -> Int8,
        membership_id -> Int8,
        kind -> Text,
        from_status -> Nullable<Text>,
        to_status -> Text,
        actor -> Text,
        reason -> Nullable<Text>,
        summary -> Text,
        trace_id -> Text,
        from_member_id -> Nullable<Int8>,
        to_member_id -> Nullable<Int8>,
        at -> Timestamptz,
    }
}

diesel::table! {
    catalog_changes (id) {
        id -> Int8,
        store_id -> Int8,
        membership_plan_id -> Nullable<Int8>,
        class_pack_id -> Nullable<Int8>,
        retired -> Bool,
        summary -> Text,
        actor -> Text,
        trace_id -> Text,
        at -> Timestamptz,
    }
}
