"""OpenEnv, both ways: any OpenEnv server played as an env (``client``), every env served over OpenEnv (``server``)."""
