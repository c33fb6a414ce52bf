"""WRONG ON PURPOSE (domino_prediction_reads_the_model): the prediction is read from the
package's own model of the schedule instead of derived from the link's alpha and beta and the
compute rate; the grader must refuse it however right the number is."""
from workbook.grading.labs import run_reference_in

run_reference_in(globals(), "domino")


def predict_exposed_ms(link, model, batch, p, ranks, inter_layer=True):                          # noqa: F811
    from workbook.tensor_parallel import domino_plan
    return domino_plan.exposed_ms(None, inter_layer=inter_layer, model=model, batch=batch, p=p,
                                  flops_rate=link.local_flops, lk=link, ranks=ranks)
