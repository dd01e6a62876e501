//! A role's server sheds load beyond an adaptive concurrency limit when the roles' settings ask
//! for one (`volley testbed --adaptive-limit`, `volley testbed-role --adaptive-limit`).

use volley::ConcurrencyLimit;
use volley::controller::{Controller, ControllerConfig};
use volley::service_client::Mode;
use volley_testbed::CorpusSpec;
use volley_testbed::codec::General;
use volley_testbed::roles::{self, Role, RoleSettings};

#[tokio::test]
async fn a_roles_server_has_the_adaptive_limit_its_settings_ask_for() {
    let controller = Controller::new(ControllerConfig::default());
    let registry = controller.listen("tcp://127.0.0.1:0").await.unwrap().to_string();
    for limit in [Some(ConcurrencyLimit::default()), None] {
        let settings = RoleSettings {
            registry: registry.clone(),
            mode: Mode::Direct,
            batch: 1,
            corpus: CorpusSpec::Synthetic { docs: 10, seed: 1 },
            prefer_local: false,
            concurrency_limit: limit,
        };
        let role = roles::start::<General>(Role::La, &settings, "tcp://127.0.0.1:0", &[]).await.unwrap();
        let expected = limit.map(|l| (l.initial, 0));
        assert_eq!(role.server.concurrency(), expected, "settings {limit:?}");
        role.shutdown().await;
    }
    controller.shutdown().await;
}
