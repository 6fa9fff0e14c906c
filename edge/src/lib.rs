pub mod plain;
pub mod text;
pub mod encode;
