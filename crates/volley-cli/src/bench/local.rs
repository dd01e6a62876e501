//! The servers `volley bench` starts in its own process: an echo server for each API measured,
//! and in registry modes a controller it registers with.

use volley::bytes::Bytes;
use volley::controller::{Controller, ControllerConfig};
use volley::discovery::InstanceSpec;
use volley::registry::{LeaseConfig, Registry};
use volley::{Server, ServerBuilder};

use super::api::Api;
use super::args::{BenchArgs, Handler, RegistryMode};
use super::transport::Transport;
use crate::echo::{EchoAsyncServer, EchoServer, Echoer, method_named, server_named_with};

/// Where the load goes.
#[derive(Debug, Clone)]
pub enum Target {
    /// A server at this address.
    Plain(String),
    /// The service, through the registry at this address.
    Registry(String, RegistryMode),
}

/// What `volley bench` started in-process (the server, and a controller in registry modes).
pub struct Local {
    server: Server,
    controller: Option<Controller>,
}

impl Local {
    async fn start(args: &BenchArgs, mode: RegistryMode, api: Api) -> Result<(Target, Local), String> {
        let (server, role) = echo_server(args, api);
        let bound = server.listen(&args.transport.listen_address(role)).await.map_err(|e| e.to_string())?;
        if mode == RegistryMode::None {
            return Ok((Target::Plain(bound.to_string()), Local { server, controller: None }));
        }
        let controller = Controller::new(ControllerConfig::default());
        let reg_addr = controller
            .listen(&args.transport.listen_address("registry"))
            .await
            .map_err(|e| e.to_string())?
            .to_string();
        let registry = Registry::connect(&reg_addr).await.map_err(|e| e.to_string())?;
        let mut spec = InstanceSpec::new(args.service.clone(), bound.to_string());
        if args.prefer_local {
            let shm = server.listen(&Transport::Shm.listen_address(role)).await.map_err(|e| e.to_string())?;
            spec = spec.local_address(shm.to_string());
        }
        registry.register(&server, vec![spec], LeaseConfig::default()).await.map_err(|e| e.to_string())?;
        Ok((Target::Registry(reg_addr, mode), Local { server, controller: Some(controller) }))
    }

    /// A server (and controller) for each API, in this order.
    pub async fn start_all(
        args: &BenchArgs,
        mode: RegistryMode,
        apis: &[Api],
    ) -> Result<(Vec<(Api, Target)>, Vec<Local>), String> {
        let (mut targets, mut locals) = (Vec::new(), Vec::new());
        for &api in apis {
            let (target, local) = Local::start(args, mode, api).await?;
            targets.push((api, target));
            locals.push(local);
        }
        Ok((targets, locals))
    }

    pub async fn shutdown(self) {
        self.server.shutdown().await;
        if let Some(c) = self.controller {
            c.shutdown().await;
        }
    }
}

/// The echo server for `api` in the handler form `--handler` asks for, and the role its
/// listening address is named for.
fn echo_server(args: &BenchArgs, api: Api) -> (Server, &'static str) {
    let settings = |b: ServerBuilder| args.transport.server_settings(b).metrics(!args.no_metrics);
    match (api, args.handler) {
        (Api::Method, Handler::Sync) => (server_named_with(&args.service, settings), "echo"),
        (Api::Method, Handler::Async) => {
            let m = method_named(&args.service);
            (settings(Server::builder().handle(&m, |b: Bytes| async move { Ok(b) })).build(), "echo")
        }
        (Api::Generated, Handler::Sync) => {
            (settings(Server::builder().serve(EchoServer::new(Echoer))).build(), "echo-generated")
        }
        (Api::Generated, Handler::Async) => {
            (settings(Server::builder().serve(EchoAsyncServer::new(Echoer))).build(), "echo-generated")
        }
    }
}
