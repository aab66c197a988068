//! How the studio's words are spelled: each one is a Rust enum whose variants carry the one
//! text it is stored and shown as (`WECHAT_PAY`, `CLASS_PACK`, `TOP_UP`, …). The database
//! mapping (`db::vocabulary`) and the GraphQL mirrors (`graphql::types::enums`) are written
//! against these enums, so the text of a word exists in one place in Rust.

/// Defines a word enum: its variants with their texts, `ALL` in declaration order, `as_str`,
/// `parse`, `Display`, and serde as the text (for the JSON of outbox payloads). Exported for
/// the closed words of the layers above (`base::auth::Role`) as
/// `fitorder_domain::vocabulary::vocabulary!`.
#[doc(hidden)]
#[macro_export]
macro_rules! __vocabulary {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $text:literal ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $(#[$vmeta])* $variant ),*
        }

        impl $name {
            /// Every word, in declaration order.
            pub const ALL: [$name; [$($text),*].len()] = [$($name::$variant),*];

            /// The word as stored and shown.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),*
                }
            }

            /// The word for `text` as stored; `None` for any other text.
            pub fn parse(text: &str) -> Option<$name> {
                match text {
                    $($text => Some($name::$variant),)*
                    _ => None,
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl $crate::vocabulary::serde::Serialize for $name {
            fn serialize<S: $crate::vocabulary::serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> $crate::vocabulary::serde::Deserialize<'de> for $name {
            fn deserialize<D: $crate::vocabulary::serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = <std::borrow::Cow<'de, str> as $crate::vocabulary::serde::Deserialize>::deserialize(d)?;
                $name::parse(&text).ok_or_else(|| {
                    $crate::vocabulary::serde::de::Error::custom(format!("unknown {} {text:?}", stringify!($name)))
                })
            }
        }
    };
}

pub use crate::__vocabulary as vocabulary;
/// The serde the words' impls name (a crate using the macro need not depend on it).
#[doc(hidden)]
pub use serde;

#[cfg(test)]
mod tests {
    use super::vocabulary;

    vocabulary! {
        /// A test word.
        pub enum Colour {
            Red = "RED",
            DarkBlue = "DARK_BLUE",
        }
    }

    #[test]
    fn words_round_trip_and_nothing_else_parses() {
        for c in Colour::ALL {
            assert_eq!(Colour::parse(c.as_str()), Some(c));
            assert_eq!(c.to_string(), c.as_str());
        }
        assert_eq!(Colour::ALL, [Colour::Red, Colour::DarkBlue]);
        assert_eq!(Colour::parse("red"), None);
        assert_eq!(Colour::parse(""), None);
        assert_eq!(
            serde_json::to_value(Colour::DarkBlue).unwrap(),
            serde_json::json!("DARK_BLUE")
        );
        assert_eq!(
            serde_json::from_value::<Colour>(serde_json::json!("RED")).unwrap(),
            Colour::Red
        );
        assert!(serde_json::from_value::<Colour>(serde_json::json!("GREEN")).is_err());
    }
}
