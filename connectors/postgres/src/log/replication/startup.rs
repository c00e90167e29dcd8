//! The way into a replication session: SSLRequest and the TLS handshake, then the startup
//! message and the authentication exchange (trust, cleartext, MD5, SCRAM-SHA-256 with or
//! without channel binding) up to ReadyForQuery. Its own file because it is where the
//! session's security is decided: whether TLS is required, and when a password may be
//! sent.

use std::io;
use std::sync::Arc;

use bytes::BytesMut;
use fallible_iterator::FallibleIterator;
use outboxd_connector::ConnectorError;
use outboxd_connector_kit::tls::{Negotiated, TlsUse};
use postgres_protocol::authentication::md5_hash;
use postgres_protocol::authentication::sasl::{
    ChannelBinding, ScramSha256, SCRAM_SHA_256, SCRAM_SHA_256_PLUS,
};
use postgres_protocol::message::backend::Message;
use postgres_protocol::message::frontend;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::wire::{server_error, Backend};
use super::{PgStream, ReplicationConnection};
use crate::tls::PgTls;
use crate::PostgresConfig;

impl ReplicationConnection {
    pub(super) async fn startup(
        &mut self,
        config: &PostgresConfig,
        tls: &Arc<PgTls>,
    ) -> Result<(), ConnectorError> {
        let params = [
            ("user", config.user.as_str()),
            ("database", config.database.as_str()),
            ("replication", "database"),
            ("application_name", "outboxd"),
            // pgoutput renders values with this session's settings: UTF-8 text,
            // timestamps as ISO 8601 in UTC, bytea in hex.
            ("client_encoding", "UTF8"),
            ("DateStyle", "ISO"),
            ("TimeZone", "UTC"),
            ("bytea_output", "hex"),
        ];
        frontend::startup_message(params.iter().copied(), &mut self.wbuf)
            .map_err(|e| self.protocol_error("encoding the startup message", e))?;
        self.flush().await?;

        let endpoint = self.endpoint.clone();
        let password = || {
            config
                .password
                .as_ref()
                .map(|p| p.expose().as_bytes())
                .ok_or_else(|| {
                    ConnectorError::definite(format!(
                    "PostgreSQL at {} asks a password for role `{}` and none is configured: set \
                     `source.password_file`, OUTBOXD_SOURCE_PASSWORD or `source.password`",
                    endpoint, config.user
                ))
                })
        };
        let mut scram: Option<ScramSha256> = None;
        loop {
            let message = match self.read_backend().await? {
                Backend::Message(m) => m,
                Backend::CopyBothResponse => {
                    return Err(self.unexpected("CopyBothResponse during authentication"))
                }
            };
            match message {
                Message::AuthenticationOk => break,
                Message::AuthenticationCleartextPassword => {
                    if !tls.password_allowed(&self.negotiated) {
                        return Err(tls.password_refused(
                            &self.context(),
                            "in cleartext",
                            &self.negotiated,
                        ));
                    }
                    frontend::password_message(password()?, &mut self.wbuf)
                        .map_err(|e| self.protocol_error("encoding the password", e))?;
                    self.flush().await?;
                }
                Message::AuthenticationMd5Password(body) => {
                    if !tls.password_allowed(&self.negotiated) {
                        return Err(tls.password_refused(
                            &self.context(),
                            "as an MD5 hash",
                            &self.negotiated,
                        ));
                    }
                    let hash = md5_hash(config.user.as_bytes(), password()?, body.salt());
                    frontend::password_message(hash.as_bytes(), &mut self.wbuf)
                        .map_err(|e| self.protocol_error("encoding the password", e))?;
                    self.flush().await?;
                }
                Message::AuthenticationSasl(body) => {
                    let mut mechanisms = body.mechanisms();
                    let mut offered = Vec::new();
                    while let Some(m) = mechanisms
                        .next()
                        .map_err(|e| self.protocol_error("SASL mechanisms", e))?
                    {
                        offered.push(m.to_owned());
                    }
                    let has_plus = offered.iter().any(|m| m == SCRAM_SHA_256_PLUS);
                    let has_plain = offered.iter().any(|m| m == SCRAM_SHA_256);
                    // As libpq and tokio-postgres with channel_binding=prefer: bind to the
                    // server's certificate when both sides can ("p=tls-server-end-point"),
                    // so a man in the middle cannot relay the exchange; "y,," says we
                    // could but the server did not offer it (the server then fails the
                    // login if it did offer it and someone removed it); "n,,": no TLS.
                    let (binding, mechanism) = match (&self.channel_binding, has_plus, has_plain) {
                        (Some(hash), true, _) => (
                            ChannelBinding::tls_server_end_point(hash.clone()),
                            SCRAM_SHA_256_PLUS,
                        ),
                        (Some(_), false, true) => (ChannelBinding::unrequested(), SCRAM_SHA_256),
                        (None, _, true) => (ChannelBinding::unsupported(), SCRAM_SHA_256),
                        _ => {
                            return Err(ConnectorError::definite(format!(
                                "PostgreSQL at {} offers SASL mechanisms {offered:?}; outboxd \
                                 supports SCRAM-SHA-256 (and SCRAM-SHA-256-PLUS over TLS)",
                                self.endpoint
                            )))
                        }
                    };
                    let client = ScramSha256::new(password()?, binding);
                    frontend::sasl_initial_response(mechanism, client.message(), &mut self.wbuf)
                        .map_err(|e| self.protocol_error("encoding SASLInitialResponse", e))?;
                    scram = Some(client);
                    self.flush().await?;
                }
                Message::AuthenticationSaslContinue(body) => {
                    let client = scram
                        .as_mut()
                        .ok_or_else(|| self.unexpected("SASLContinue before SASL started"))?;
                    client.update(body.data()).map_err(|e| self.auth_error(e))?;
                    frontend::sasl_response(client.message(), &mut self.wbuf)
                        .map_err(|e| self.protocol_error("encoding SASLResponse", e))?;
                    self.flush().await?;
                }
                Message::AuthenticationSaslFinal(body) => {
                    let client = scram
                        .as_mut()
                        .ok_or_else(|| self.unexpected("SASLFinal before SASL started"))?;
                    client.finish(body.data()).map_err(|e| self.auth_error(e))?;
                }
                Message::ErrorResponse(body) => {
                    return Err(server_error(body.fields(), &self.context()))
                }
                Message::NoticeResponse(_) => {}
                _ => {
                    return Err(ConnectorError::definite(format!(
                        "PostgreSQL at {} asks for an authentication method outboxd does not \
                         support (supported: trust, password, md5, scram-sha-256)",
                        self.endpoint
                    )))
                }
            }
        }
        // After AuthenticationOk: ParameterStatus and BackendKeyData until ReadyForQuery.
        loop {
            match self.read_backend().await? {
                Backend::Message(Message::ReadyForQuery(_)) => return Ok(()),
                Backend::Message(Message::ErrorResponse(body)) => {
                    return Err(server_error(body.fields(), &self.context()))
                }
                Backend::Message(
                    Message::ParameterStatus(_)
                    | Message::BackendKeyData(_)
                    | Message::NoticeResponse(_),
                ) => {}
                _ => return Err(self.unexpected("message during startup")),
            }
        }
    }
}

/// Sends SSLRequest and wraps the socket in TLS when the server agrees, per the TLS
/// policy; a server that refuses TLS when it is required is refused in turn.
pub(super) async fn negotiate_tls(
    mut tcp: TcpStream,
    config: &PostgresConfig,
    tls: &PgTls,
    context: &str,
) -> Result<(PgStream, Negotiated), ConnectorError> {
    if tls.policy().tls == TlsUse::Off {
        return Ok((PgStream::Plain(tcp), Negotiated::Plain));
    }
    let io_err = |e: io::Error| ConnectorError::transient(context.to_owned()).with_source(e);
    let mut buf = BytesMut::new();
    frontend::ssl_request(&mut buf);
    tcp.write_all(&buf).await.map_err(io_err)?;
    let answer = tcp.read_u8().await.map_err(io_err)?;
    match answer {
        b'S' => {}
        b'N' if tls.policy().tls_required() => return Err(tls.policy().downgrade_refused(context)),
        b'N' => return Ok((PgStream::Plain(tcp), Negotiated::Plain)),
        other => {
            return Err(ConnectorError::definite(format!(
                "{context}: unexpected answer {other} to SSLRequest"
            )))
        }
    }
    let (stream, negotiated) = tls.handshake(tcp, &config.host, context).await?;
    Ok((PgStream::Tls(Box::new(stream)), negotiated))
}
