resource "kubernetes_namespace_v1" "sieve" {
  metadata {
    name = local.aws.namespace
  }
}

# Nothing reaches a pod in the namespace unless a policy below admits it (the VPC CNI enforces them).
resource "kubernetes_network_policy_v1" "default_deny" {
  metadata {
    name      = "default-deny-ingress"
    namespace = kubernetes_namespace_v1.sieve.metadata[0].name
  }
  spec {
    pod_selector {}
    policy_types = ["Ingress"]
  }
}

module "cluster_addons" {
  source              = "../../../modules/cluster_addons"
  cluster_name        = local.aws.cluster_name
  region              = local.aws.region
  autoscaler_role_arn = local.aws.workload_role_arns["cluster-autoscaler"]
}

module "mlflow" {
  source        = "../../../modules/mlflow"
  namespace     = kubernetes_namespace_v1.sieve.metadata[0].name
  role_arn      = local.aws.workload_role_arns["mlflow"]
  db_secret_arn = local.aws.db_secret_arn
  region        = local.aws.region
  bucket        = local.aws.bucket
  image         = var.image
}

module "ray" {
  source             = "../../../modules/ray"
  namespace          = kubernetes_namespace_v1.sieve.metadata[0].name
  image              = var.image
  role_arn           = local.aws.workload_role_arns["ray"]
  tracking_uri       = module.mlflow.tracking_uri
  mlflow_secret_name = module.mlflow.jobs_secret_name
  storage_uri        = "s3://${local.aws.bucket}"
  cpu_worker_group   = var.ray_cpu_worker_group
  gpu_worker_groups  = var.ray_gpu_worker_groups
  depends_on         = [module.cluster_addons]
}
