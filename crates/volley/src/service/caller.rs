//! What a generated typed client calls through: [`Caller`] (a [`Client`] or a
//! [`ServiceClient`]) and [`ServiceCaller`] (a [`ServiceClient`]: key routing and
//! scatter-gather). Each method of the typed client requires the trait for its own request and
//! reply types only, so a `ServiceClient`'s need to clone requests is asked of the methods it
//! is used for, not of the whole service.
//!
//! The impls are `#[diagnostic::do_not_recommend]`: a call that does not fit is reported with
//! the traits' own messages (which say what a `ServiceClient` needs) rather than as a missing
//! `Clone` deep inside an impl's bounds.

use std::future::Future;

use futures_util::stream::{self, Stream, StreamExt};

use crate::client::{BatchOptions, CallOptions, Client, StreamOptions, StreamSender, Streaming, Upload};
use crate::codec::{StableHash, Wire};
use crate::error::Error;
use crate::method::{BidiStreamMethod, ClientStreamMethod, Method, StreamMethod};
use crate::service_client::{Gathered, ServiceClient};

/// Calls methods whose request type is `Req` and reply type `Resp`: implemented by
/// [`Client`] for every pair of [`Wire`] types, and by [`ServiceClient`] when `Req` is also
/// `Clone` (it may send a request again to another instance).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot call a method with request `{Req}` and reply `{Resp}`",
    note = "a `Client` calls methods whose request and reply are wire types (`volley::wire!`); a \
            `ServiceClient` also needs the request to be `Clone` (it may send it again on failover)"
)]
pub trait Caller<Req, Resp> {
    /// One call ([`Client::call_with`], [`ServiceClient::call_with`]).
    fn call(
        &self,
        m: &Method<Req, Resp>,
        req: Req,
        opts: CallOptions,
    ) -> impl Future<Output = Result<Resp, Error>> + Send;

    /// The batch API: one result per request, in order ([`Client::call_batch_with`],
    /// [`ServiceClient::call_batch_with`]).
    fn call_batch(
        &self,
        m: &Method<Req, Resp>,
        reqs: Vec<Req>,
        opts: BatchOptions,
    ) -> impl Future<Output = Vec<Result<Resp, Error>>> + Send;

    /// A batch of any size with `opts.window` chunks in flight, results in order.
    fn call_stream<'a, I>(
        &'a self,
        m: &'a Method<Req, Resp>,
        reqs: I,
        opts: BatchOptions,
    ) -> impl Stream<Item = Result<Resp, Error>> + Send + 'a
    where
        I: IntoIterator<Item = Req>,
        I::IntoIter: Send + 'a;
}

/// Calls that need the registry's view of a service: key routing and scatter-gather.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot route calls by key or scatter them",
    note = "key routing and scatter-gather need a `ServiceClient` (calls by service name through \
            the registry), and a request type that is `Clone`"
)]
pub trait ServiceCaller<Req, Resp>: Caller<Req, Resp> {
    /// [`ServiceClient::call_keyed_with`]: the instance that owns `key` on the hash ring.
    fn call_keyed<K: StableHash + Sync + ?Sized>(
        &self,
        m: &Method<Req, Resp>,
        key: &K,
        req: Req,
        opts: CallOptions,
    ) -> impl Future<Output = Result<Resp, Error>> + Send;

    /// [`ServiceClient::scatter_with`]: every instance, each one's result.
    fn scatter(
        &self,
        m: &Method<Req, Resp>,
        req: Req,
        opts: CallOptions,
    ) -> impl Future<Output = Result<Vec<Gathered<Resp>>, Error>> + Send;
}

#[diagnostic::do_not_recommend]
impl<Req: Wire, Resp: Wire> Caller<Req, Resp> for Client {
    fn call(
        &self,
        m: &Method<Req, Resp>,
        req: Req,
        opts: CallOptions,
    ) -> impl Future<Output = Result<Resp, Error>> + Send {
        self.call_with(m, req, opts)
    }

    fn call_batch(
        &self,
        m: &Method<Req, Resp>,
        reqs: Vec<Req>,
        opts: BatchOptions,
    ) -> impl Future<Output = Vec<Result<Resp, Error>>> + Send {
        self.call_batch_with(m, reqs, opts)
    }

    fn call_stream<'a, I>(
        &'a self,
        m: &'a Method<Req, Resp>,
        reqs: I,
        opts: BatchOptions,
    ) -> impl Stream<Item = Result<Resp, Error>> + Send + 'a
    where
        I: IntoIterator<Item = Req>,
        I::IntoIter: Send + 'a,
    {
        self.call_batch_stream(m, reqs, opts)
    }
}

#[diagnostic::do_not_recommend]
impl<Req: Wire + Clone, Resp: Wire> Caller<Req, Resp> for ServiceClient {
    fn call(
        &self,
        m: &Method<Req, Resp>,
        req: Req,
        opts: CallOptions,
    ) -> impl Future<Output = Result<Resp, Error>> + Send {
        self.call_with(m, req, opts)
    }

    fn call_batch(
        &self,
        m: &Method<Req, Resp>,
        reqs: Vec<Req>,
        opts: BatchOptions,
    ) -> impl Future<Output = Vec<Result<Resp, Error>>> + Send {
        self.call_batch_with(m, reqs, opts)
    }

    /// Each chunk is one `call_batch` (so chunks spread over the instances by the balancing
    /// policy), with `opts.window` chunks in flight; the requests are pulled from `reqs` only
    /// as the window moves.
    fn call_stream<'a, I>(
        &'a self,
        m: &'a Method<Req, Resp>,
        reqs: I,
        opts: BatchOptions,
    ) -> impl Stream<Item = Result<Resp, Error>> + Send + 'a
    where
        I: IntoIterator<Item = Req>,
        I::IntoIter: Send + 'a,
    {
        let chunk = opts.chunk_size.max(1);
        stream::iter(reqs)
            .chunks(chunk)
            .map(move |c| self.call_batch_with(m, c, opts.chunk_size(chunk)))
            .buffered(opts.window.max(1))
            .flat_map(stream::iter)
    }
}

#[diagnostic::do_not_recommend]
impl<Req: Wire + Clone, Resp: Wire> ServiceCaller<Req, Resp> for ServiceClient {
    fn call_keyed<K: StableHash + Sync + ?Sized>(
        &self,
        m: &Method<Req, Resp>,
        key: &K,
        req: Req,
        opts: CallOptions,
    ) -> impl Future<Output = Result<Resp, Error>> + Send {
        self.call_keyed_with(m, key, req, opts)
    }

    fn scatter(
        &self,
        m: &Method<Req, Resp>,
        req: Req,
        opts: CallOptions,
    ) -> impl Future<Output = Result<Vec<Gathered<Resp>>, Error>> + Send {
        self.scatter_with(m, req, opts)
    }
}

/// Opens server streams whose request type is `Req` and item type `Item`: implemented by
/// [`Client`] and [`ServiceClient`] for every pair of [`Wire`] types. A stream stays on the
/// connection (the instance) that opened it.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot open a stream with request `{Req}` and items `{Item}`",
    note = "a `Client` or a `ServiceClient` opens streams whose request and items are wire types (`volley::wire!`)"
)]
pub trait StreamCaller<Req, Item> {
    /// Opens the stream ([`Client::open_stream_with`]).
    fn open(
        &self,
        m: &StreamMethod<Req, Item>,
        req: Req,
        opts: StreamOptions,
    ) -> impl Future<Output = Result<Streaming<Item>, Error>> + Send;
}

#[diagnostic::do_not_recommend]
impl<Req: Wire, Item: Wire> StreamCaller<Req, Item> for Client {
    fn open(
        &self,
        m: &StreamMethod<Req, Item>,
        req: Req,
        opts: StreamOptions,
    ) -> impl Future<Output = Result<Streaming<Item>, Error>> + Send {
        self.open_stream_with(m, req, opts)
    }
}

#[diagnostic::do_not_recommend]
impl<Req: Wire, Item: Wire> StreamCaller<Req, Item> for ServiceClient {
    fn open(
        &self,
        m: &StreamMethod<Req, Item>,
        req: Req,
        opts: StreamOptions,
    ) -> impl Future<Output = Result<Streaming<Item>, Error>> + Send {
        self.open_stream_with(m, req, opts)
    }
}

/// Opens client streams whose requests are `Req` and reply `Resp`: implemented by [`Client`]
/// and [`ServiceClient`] for every pair of [`Wire`] types.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot open a client stream with requests `{Req}` and reply `{Resp}`",
    note = "a `Client` or a `ServiceClient` opens streams whose requests and reply are wire types (`volley::wire!`)"
)]
pub trait ClientStreamCaller<Req, Resp> {
    /// Opens the stream ([`Client::open_client_stream`]).
    fn open_client(
        &self,
        m: &ClientStreamMethod<Req, Resp>,
        opts: StreamOptions,
    ) -> impl Future<Output = Result<Upload<Req, Resp>, Error>> + Send;
}

#[diagnostic::do_not_recommend]
impl<Req: Wire, Resp: Wire> ClientStreamCaller<Req, Resp> for Client {
    fn open_client(
        &self,
        m: &ClientStreamMethod<Req, Resp>,
        opts: StreamOptions,
    ) -> impl Future<Output = Result<Upload<Req, Resp>, Error>> + Send {
        self.open_client_stream(m, opts)
    }
}

#[diagnostic::do_not_recommend]
impl<Req: Wire, Resp: Wire> ClientStreamCaller<Req, Resp> for ServiceClient {
    fn open_client(
        &self,
        m: &ClientStreamMethod<Req, Resp>,
        opts: StreamOptions,
    ) -> impl Future<Output = Result<Upload<Req, Resp>, Error>> + Send {
        self.open_client_stream(m, opts)
    }
}

/// Opens both-way streams whose requests are `Req` and items `Item`: implemented by
/// [`Client`] and [`ServiceClient`] for every pair of [`Wire`] types.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot open a both-way stream with requests `{Req}` and items `{Item}`",
    note = "a `Client` or a `ServiceClient` opens streams whose requests and items are wire types (`volley::wire!`)"
)]
pub trait BidiStreamCaller<Req, Item> {
    /// Opens the stream ([`Client::open_bidi_stream`]).
    #[allow(clippy::type_complexity)]
    fn open_bidi(
        &self,
        m: &BidiStreamMethod<Req, Item>,
        opts: StreamOptions,
    ) -> impl Future<Output = Result<(StreamSender<Req>, Streaming<Item>), Error>> + Send;
}

#[diagnostic::do_not_recommend]
impl<Req: Wire, Item: Wire> BidiStreamCaller<Req, Item> for Client {
    fn open_bidi(
        &self,
        m: &BidiStreamMethod<Req, Item>,
        opts: StreamOptions,
    ) -> impl Future<Output = Result<(StreamSender<Req>, Streaming<Item>), Error>> + Send {
        self.open_bidi_stream(m, opts)
    }
}

#[diagnostic::do_not_recommend]
impl<Req: Wire, Item: Wire> BidiStreamCaller<Req, Item> for ServiceClient {
    fn open_bidi(
        &self,
        m: &BidiStreamMethod<Req, Item>,
        opts: StreamOptions,
    ) -> impl Future<Output = Result<(StreamSender<Req>, Streaming<Item>), Error>> + Send {
        self.open_bidi_stream(m, opts)
    }
}
