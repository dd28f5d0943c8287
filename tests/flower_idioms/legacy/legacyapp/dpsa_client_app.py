"""legacyapp under central DP and SecAgg+, as fl-dp-sa combines them: the update clipped on the client, then
masked."""

from flwr.client.mod import fixedclipping_mod, secaggplus_mod
from flwr.clientapp import ClientApp

from legacyapp.client_app import client_fn

app = ClientApp(client_fn=client_fn, mods=[secaggplus_mod, fixedclipping_mod])
