//! Logs: text for a person at a terminal, or one JSON object per line for a log system
//! (`FITORDER_LOG_FORMAT=json`, the default when standard output is not a terminal). A JSON
//! line carries `time`, `level`, `target`, `message`, `fields` and — on every line written
//! inside a request, a delivery or a task that has one — `trace_id`, taken from the nearest
//! enclosing span with a `trace_id` field, so the log system strings the chain together with
//! the same id the rows carry.

use std::fmt;
use std::io::IsTerminal;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

/// `FITORDER_LOG_FORMAT` (a setting, `config::Config::log_format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

impl LogFormat {
    /// The format set, or when none is: JSON unless standard output is a terminal.
    pub fn or_by_terminal(set: Option<LogFormat>) -> LogFormat {
        match set {
            Some(format) => format,
            None if std::io::stdout().is_terminal() => LogFormat::Text,
            None => LogFormat::Json,
        }
    }
}

/// Installs the global subscriber (logs go to standard error).
pub fn init(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info,tower_http=warn,diesel_migrations=warn".into());
    match format {
        LogFormat::Text => tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(std::io::stderr().is_terminal())
            .with_writer(std::io::stderr)
            .init(),
        LogFormat::Json => tracing_subscriber::registry()
            .with(TraceIds)
            .with(
                tracing_subscriber::fmt::layer()
                    .event_format(JsonLines)
                    .with_ansi(false)
                    .with_writer(std::io::stderr),
            )
            .with(filter)
            .init(),
    }
}

/// A span's trace id, kept in its extensions.
struct SpanTrace(String);

/// Remembers the `trace_id` field of every span that has one.
pub struct TraceIds;

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for TraceIds {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut v = Fields::default();
        attrs.record(&mut v);
        if let Some(Value::String(t)) = v.fields.remove("trace_id") {
            if let Some(span) = ctx.span(id) {
                span.extensions_mut().insert(SpanTrace(t));
            }
        }
    }
}

#[derive(Default)]
struct Fields {
    message: Option<String>,
    fields: Map<String, Value>,
}

impl Fields {
    fn put(&mut self, field: &Field, v: Value) {
        if field.name() == "message" {
            self.message = Some(match v {
                Value::String(s) => s,
                other => other.to_string(),
            });
        } else {
            self.fields.insert(field.name().to_string(), v);
        }
    }
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Value::String(value.to_string()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, Value::from(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, Value::from(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Value::from(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, Value::from(value));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.put(field, Value::String(format!("{value:?}")));
    }
}

/// One JSON object per line.
pub struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        let mut v = Fields::default();
        event.record(&mut v);
        let meta = event.metadata();
        let mut trace = match v.fields.remove("trace_id") {
            Some(Value::String(t)) => Some(t),
            _ => None,
        };
        // The event's spans, innermost first (an explicit `parent:` counts as well).
        let mut innermost = None;
        if let Some(scope) = ctx.event_scope() {
            for span in scope {
                innermost.get_or_insert_with(|| span.name());
                if trace.is_some() {
                    break;
                }
                if let Some(t) = span.extensions().get::<SpanTrace>() {
                    trace = Some(t.0.clone());
                    break;
                }
            }
        }
        let mut line = Map::new();
        line.insert(
            "time".into(),
            Value::String(chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
        );
        line.insert("level".into(), Value::String(meta.level().as_str().to_string()));
        line.insert("target".into(), Value::String(meta.target().to_string()));
        line.insert("message".into(), Value::String(v.message.unwrap_or_default()));
        line.insert("fields".into(), Value::Object(v.fields));
        if let Some(name) = innermost {
            line.insert("span".into(), Value::String(name.to_string()));
        }
        if let Some(t) = trace {
            line.insert("trace_id".into(), Value::String(t));
        }
        writeln!(writer, "{}", Value::Object(line))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn every_line_inside_a_traced_span_carries_its_trace_id() {
        let buf = Buf::default();
        let w = buf.clone();
        let subscriber = tracing_subscriber::registry().with(TraceIds).with(
            tracing_subscriber::fmt::layer()
                .event_format(JsonLines)
                .with_ansi(false)
                .with_writer(move || w.clone()),
        );
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(n = 1, "outside");
            let span = tracing::info_span!("request", trace_id = %"abc123", route = "/graphql");
            let _g = span.enter();
            let inner = tracing::info_span!("inner", step = 2);
            let _i = inner.enter();
            tracing::warn!(order_no = "FO1", ok = true, "inside \"quoted\"");
        });
        let out = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["message"], "outside");
        assert!(lines[0].get("trace_id").is_none());
        assert_eq!(lines[0]["fields"]["n"], 1);
        assert_eq!(lines[1]["trace_id"], "abc123");
        assert_eq!(lines[1]["level"], "WARN");
        assert_eq!(lines[1]["message"], "inside \"quoted\"");
        assert_eq!(lines[1]["fields"]["order_no"], "FO1");
        assert_eq!(lines[1]["fields"]["ok"], true);
        assert!(!out.contains('\u{1b}'), "no ANSI escapes");
    }
}
